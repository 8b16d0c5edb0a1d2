"""Collecting episodes of a policy (expert, random or a model) into a conversation file.

The episodes are played by the same `RolloutEngine` (through `eval.evaluate`) as evaluation
and RL, so a collected file has exactly the layout the trainers produce and consume.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..eval.evaluate import evaluate_played
from ..eval.metrics import Summary
from ..config import PlayConfig
from ..rollout.formats import trajectory_to_agenttraj, trajectory_to_chat, write_agenttraj, write_chat
from ..rollout.trajectory import Trajectory, save_trajectories

FORMATS = ("agenttraj", "chat", "trajectory")
"""agenttraj: AgentGym's SFT records; chat: {"messages": [...]} records; trajectory: our
full records (token ids, masks and logprobs of a model policy included)."""


@dataclass
class Collected:
    """What `collect` played and wrote.

    Attributes:
        summary: `eval.metrics.summarize` fields of all episodes played (success = the
            fraction of episodes that succeeded).
        written: records written to the file.
        dropped_failures: episodes left out by `successes_only`.
        dropped_unwritable: episodes with no assistant turn (the environment failed at
            reset), which AgentTraj and chat records cannot hold.
    """

    summary: Summary
    written: int
    dropped_failures: int
    dropped_unwritable: int


def write_conversations(trajectories: list[Trajectory], path: str | Path, fmt: str) -> None:
    """Write `trajectories` to `path` in `fmt` (one of `FORMATS`)."""
    if fmt == "agenttraj":
        write_agenttraj([trajectory_to_agenttraj(t) for t in trajectories], path)
    elif fmt == "chat":
        write_chat([trajectory_to_chat(t) for t in trajectories], path)
    elif fmt == "trajectory":
        save_trajectories(trajectories, path)
    else:
        raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def collect(config: PlayConfig, policy: str, out: str | Path, fmt: str = "agenttraj",
            successes_only: bool = False) -> Collected:
    """Play `policy` on `config.eval.episodes` items of `config.env.eval_split` (0: all; the first
    ones, or spread over its categories, as `config.eval.items` says),
    `config.eval.samples` times each, and write the episodes to `out`.

    Args:
        policy: "expert", "random" or a local model folder (sampled at `config.eval.temperature`).
        fmt: one of `FORMATS`.
        successes_only: write only the episodes that succeeded.
    """
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    evaluation, trajectories = evaluate_played(config, policy, desc=f"collect {config.env.id}/{config.env.eval_split}")
    kept = [t for t in trajectories if t.success] if successes_only else list(trajectories)
    failures = len(trajectories) - len(kept)
    unwritable = 0
    if fmt != "trajectory":
        writable = [t for t in kept if any(m["role"] == "assistant" for m in t.messages)]
        unwritable, kept = len(kept) - len(writable), writable
    write_conversations(kept, out, fmt)
    return Collected(summary=evaluation.summary, written=len(kept), dropped_failures=failures, dropped_unwritable=unwritable)
