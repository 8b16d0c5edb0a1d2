"""Rewards written in Python (`env.reward`): a function of a finished episode that replaces or
adds to the environment's reward, in training and evaluation alike.

The function is named by an import path, "package.module:function", in a config or on the
command line (never by a request to a server or the viewer), and is called once an episode ends
without an error, in the process that plays it (a Ray rollout worker imports it too):

    def reward(trajectory: Trajectory, info: dict) -> float

`trajectory` holds the whole conversation (`messages`), the environment's turn rewards and its
success; `info` is the environment's last `info`. Its value goes on the episode's last turn:
"replace" makes it the episode's reward (the other turns' rewards become 0), "add" adds it to
the environment's. A function that raises or returns something other than a finite number fails
its episode, recorded with the reason (failures are data: the update leaves the episode out).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError
from .trajectory import Trajectory

RewardFunction = Callable[[Trajectory, dict[str, Any]], float]

MODES = ("replace", "add")


def load_reward(path: str) -> RewardFunction:
    """The function at `path`, "package.module:function".

    Raises:
        UserError: a path of another form, a module that does not import, or no callable there.
    """
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise UserError(f"env.reward {path!r}: give the function as package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UserError(f"env.reward {path!r}: cannot import {module_name!r} ({error})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(f"env.reward {path!r}: {module_name} has no function {name!r}")
    return function


@dataclass(frozen=True)
class EpisodeReward:
    """A reward function and how its value meets the environment's (`MODES`)."""

    function: RewardFunction
    mode: str = "replace"
    name: str = "env.reward"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"env.reward_mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    @classmethod
    def from_config(cls, path: str | None, mode: str = "replace", judge: Any = None) -> "EpisodeReward | None":
        """The reward of `env.reward` (a function's import path), or of an LLM judge (`judge`: a
        `config.JudgeConfig` or its fields as a mapping, used when it has a url), with
        `env.reward_mode`; None when neither is set."""
        if judge is not None and not isinstance(judge, dict):
            judge = dataclasses.asdict(judge)  # a config.JudgeConfig
        if judge and judge.get("url"):
            from .judge import LLMJudge

            return cls(LLMJudge(judge["url"], judge["model"], judge["rubric"], judge.get("cache")), mode,
                       f"env.judge ({judge['url']})")
        return cls(load_reward(path), mode, path) if path else None

    @classmethod
    def from_env(cls, env: Any) -> "EpisodeReward | None":
        """The reward an `EnvConfig` names (`reward`, or `judge`), with its `reward_mode`."""
        return cls.from_config(env.reward, env.reward_mode, env.judge)

    def apply(self, trajectory: Trajectory, info: dict[str, Any]) -> None:
        """Put the function's value on `trajectory`'s last turn, in place. An episode that ended
        before its first turn has no turn to carry it and is left as it is.

        Raises:
            ValueError: the function returned something other than a finite number.
        """
        if not trajectory.turn_rewards:
            return
        value = self.function(trajectory, info)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{self.name} returned {value!r}, not a finite number")
        if self.mode == "replace":
            trajectory.turn_rewards[:] = [0.0] * (len(trajectory.turn_rewards) - 1) + [float(value)]
        else:
            trajectory.turn_rewards[-1] += float(value)
