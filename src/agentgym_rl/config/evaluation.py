"""The config of `agentgym-rl eval` and `agentgym-rl collect`: a policy played on the first
`eval.episodes` items of `env.eval_split`. Their flags are overrides of these sections, and
`eval --run` starts from a run's own sections."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Dict, List

from pydantic.dataclasses import dataclass

from .sections import (SECTION, EnvConfig, EvalConfig, ItemChoice, NonNegative, NonNegativeFloat, Positive,
                       RolloutConfig, RunConfig)


@dataclass(config=SECTION)
class PlayEvalConfig(EvalConfig):
    """The `eval` section of `eval` and `collect`: training's, with their own defaults. (A
    `default_factory` would hold those only while no eval key is set: `eval --samples 4` got
    training's 90 items at temperature 0, four identical greedy samples.)"""

    episodes: NonNegative = 0
    """Items played (0: every item of the split), drawn as `items` says."""
    categories: List[str] = field(default_factory=list)
    """Play only the items of these categories of the split (empty: all), named as the
    evaluation's table names them (TextCraft `depth 1`, BabyAI `GoTo`); `episodes` and `items`
    then choose among them. A name the split lacks is refused with the ones it has."""
    temperature: NonNegativeFloat = 0.0
    """Sampling temperature of a model policy (0 = greedy, `eval`'s default, as the published
    figures are; `eval --samples K` with K > 1 and `collect` sample at 1 unless told otherwise)."""


@dataclass(config=SECTION)
class PlayConfig:
    """What `eval` and `collect` play: the environment, prompt options, how many episodes and
    how they are sampled (`eval.episodes` 0: every item of the split), and `run.seed`."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: PlayEvalConfig = field(default_factory=PlayEvalConfig)


PLAYED_SECTIONS = ("env", "rollout", "eval")
"""The sections of a run's config that say how its policy sees and plays the environment."""


SYSTEM_TURN_LIMITS = {"babyai": 20, "sciworld": 30, "search": 30, "textcraft": 30, "web": 15}
"""The evaluation turn limits of the system's tables (AgentGym-RL), so that ours compare with
them (docs/METRICS.md)."""


@dataclass(config=SECTION)
class SuiteSection:
    """What `agentgym-rl bench-agent` plays: the test split of each environment, once greedily
    (the headline Avg@1) and, with `samples` > 0, `samples` times more at `temperature`
    (Avg@n, and Pass@k for k = 1..n)."""

    envs: List[str] = field(default_factory=list)
    """Environment ids; empty: every registered environment."""
    episodes: NonNegative = 0
    """N items of each test split, drawn as `items` says (0: all)."""
    items: ItemChoice = "stratified"
    """Which N items: spread over the split's categories, or its first N."""
    greedy: bool = True
    samples: NonNegative = 4
    temperature: NonNegativeFloat = 1.0
    max_turns: Dict[str, Positive] = field(default_factory=dict)
    """Turn limits by environment id; others: the system's (`SYSTEM_TURN_LIMITS`), else the
    environment's own."""
    env_kwargs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    """Constructor arguments by environment id (a run's checkpoint brings its own env's)."""


@dataclass(config=SECTION)
class SuiteConfig:
    """The config of `agentgym-rl bench-agent`: `run.seed` seeds every reset and the random
    policy; `rollout` says how a model policy sees every environment."""

    run: RunConfig = field(default_factory=RunConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    suite: SuiteSection = field(default_factory=SuiteSection)
