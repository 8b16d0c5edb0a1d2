"""Trainers (RL, SFT warm-up) and the Learner that owns model and optimizer."""
