"""Multi-turn rollouts and the Trajectory record."""

from .trajectory import Trajectory, load_trajectories, save_trajectories

__all__ = ["Trajectory", "load_trajectories", "save_trajectories"]
