"""Wrappers: one concern each."""

from __future__ import annotations

from typing import Any

from . import snapshots
from .base import StepResult, TextEnv


class Wrapper(TextEnv):
    """Forwards everything to `env`; a subclass overrides the one call its concern changes."""

    def __init__(self, env: TextEnv):
        self.env = env
        self.env_id = env.env_id
        self.instruction = env.instruction

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return self.env.reset(item_id, seed)

    def step(self, action: str) -> StepResult:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()

    def available_actions(self) -> list[str] | None:
        return self.env.available_actions()

    def expert_action(self) -> str | None:
        return self.env.expert_action()

    def snapshot(self) -> bytes:
        return self.env.snapshot()

    def restore(self, state: bytes) -> None:
        self.env.restore(state)

    @property
    def unwrapped(self) -> TextEnv:
        return self.env.unwrapped


class TurnLimit(Wrapper):
    """Truncate an episode after `max_turns` steps (the interaction horizon)."""

    def __init__(self, env: TextEnv, max_turns: int):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        super().__init__(env)
        self.max_turns = max_turns
        self.turns = 0

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.turns = 0
        return self.env.reset(item_id, seed)

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.turns += 1
        if self.turns >= self.max_turns and not terminated:
            truncated = True
        return obs, reward, terminated, truncated, info

    def snapshot(self) -> bytes:
        """The inner environment's snapshot and the turns taken, which the limit counts on from."""
        return snapshots.dump("turn_limit", (self.turns, self.env.snapshot()))

    def restore(self, state: bytes) -> None:
        turns, inner = snapshots.load("turn_limit", state)
        self.env.restore(inner)
        self.turns = turns


class InvalidActionPenalty(Wrapper):
    """Subtract `penalty` from the reward of every step the environment marks invalid
    (`info["invalid_action"]`): a dense training signal for choosing actions that exist.

    Success and termination are the environment's own, so evaluation is unchanged; only the
    reward a trainer optimises differs. Without it, a group of episodes that all fail has one
    reward and teaches nothing; with it, the episode that wasted fewer turns on impossible
    actions scores higher.
    """

    def __init__(self, env: TextEnv, penalty: float):
        if penalty < 0:
            raise ValueError(f"penalty must be >= 0, got {penalty}")
        super().__init__(env)
        self.penalty = penalty

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info.get("invalid_action"):
            reward -= self.penalty
        return obs, reward, terminated, truncated, info
