"""The text environment API every environment implements (Gymnasium-shaped).

An environment is a text game: `reset` picks a task and returns the first observation,
`step` takes the agent's action text and returns the next observation. Terminated (the
episode ended by success or failure) is kept apart from truncated (a step or turn limit
cut it short), as in Gymnasium's `Env.step`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class EnvStateError(RuntimeError):
    """The environment was used out of order (e.g. `step` before `reset`)."""


class TextEnv(ABC):
    """A text environment.

    Subclasses set `env_id` and implement `reset`, `step` and (when they hold resources)
    `close`. `info` dicts always carry `item_id` and, from `step`, `success` (bool) and
    `invalid_action` (bool: the action was not understood or not possible; the observation
    says why and the turn still counts). An environment that can name its true state adds
    `state_key` (str) to every info, reset's included: equal keys within one item mean the same
    state (GiGPO compares the turns taken from one state); its `EnvSpec` sets `state_keys`.
    One that parses actions into kinds may add `action_kind` (str) to `step`'s info: the kind
    of action it took ("pickup" for "pick up" and "pickup"), which `algo.rare_action_bonus`
    counts; without it the action's first word stands in. One that keeps track of what the agent
    has observed may add `discovered` (int) to `step`'s info: how much of the world the step
    showed for the first time in the episode (BabyAI: grid cells), which `algo.discovery_bonus`
    rewards; its `EnvSpec` sets `discoveries`.
    """

    env_id: str = ""
    #: What the agent is told about the game and the answer format (a system prompt).
    instruction: str = ""

    @abstractmethod
    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start the task `item_id` (an index, or a string `"<env>_<index>"`).

        Args:
            item_id: which task; the same id always gives the same task. None picks one
                from `seed`.
            seed: randomness for anything the item does not fix (e.g. sampling).
        Returns:
            (observation, info) with info["item_id"] the canonical string id.
        """

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one action (plain text, or a ReAct reply holding one `Action:` line).

        Returns:
            (observation, reward, terminated, truncated, info). An invalid action is not an
            exception: the observation explains it and info["invalid_action"] is True.
        Raises:
            EnvStateError: when called before `reset` or after the episode ended.
        """

    def close(self) -> None:
        """Release resources. Safe to call more than once."""

    def available_actions(self) -> list[str] | None:
        """The actions that make sense now, when the environment can list them (else None)."""
        return None

    def expert_action(self) -> str | None:
        """The reply (ReAct text) the environment's expert would give now, when it has an expert
        (else None). The expert reads the environment's own state, so it is the environment's to
        answer: an expert policy asks through this API and works through any transport."""
        return None

    def snapshot(self) -> bytes:
        """The episode's whole state, which `restore` puts back into this instance or another built
        with the same arguments: several samples can branch from one mid-episode state, and an
        unfinished episode can be resumed. Trusted data (a pickle): restore only what an
        environment of this process or server wrote (`envs.snapshots`).

        Raises:
            NotImplementedError: the environment cannot snapshot its state.
            EnvStateError: before the first reset.
        """
        raise NotImplementedError(f"environment {self.env_id!r} cannot snapshot its state")

    def restore(self, state: bytes) -> None:
        """Continue from `state`, a `snapshot` of this environment (any episode, any instance).

        Raises:
            NotImplementedError: the environment cannot snapshot its state.
            ValueError: `state` is not a snapshot of this environment.
        """
        raise NotImplementedError(f"environment {self.env_id!r} cannot restore a snapshot")

    @property
    def unwrapped(self) -> "TextEnv":
        """The innermost environment."""
        return self

    def __enter__(self) -> "TextEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EnvExpert:
    """The expert of any environment that implements `expert_action` (in-process or remote)."""

    def act(self, env: TextEnv) -> str:
        reply = env.expert_action()
        if reply is None:
            raise EnvStateError(f"environment {env.env_id!r} has no expert (its expert_action() returned None)")
        return reply


def parse_item_index(item_id: int | str, env_id: str) -> int:
    """Turn `12`, `"12"` or `"babyai_12"` into 12; anything else raises ValueError."""
    if isinstance(item_id, int):
        index = item_id
    else:
        text = str(item_id)
        prefix = f"{env_id}_"
        if text.startswith(prefix):
            text = text[len(prefix):]
        if not text.isdigit():
            raise ValueError(f"item id {item_id!r} is not '<index>' or '{env_id}_<index>'")
        index = int(text)
    if index < 0:
        raise ValueError(f"item id {item_id!r} is negative")
    return index
