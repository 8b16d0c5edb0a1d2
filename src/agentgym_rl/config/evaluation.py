"""The config of `agentgym-rl eval` and `agentgym-rl collect`: a policy played on the first
`eval.episodes` items of `env.eval_split`. Their flags are overrides of these sections, and
`eval --run` starts from a run's own sections."""

from __future__ import annotations

from dataclasses import field

from pydantic.dataclasses import dataclass

from .sections import SECTION, EnvConfig, EvalConfig, RolloutConfig, RunConfig


@dataclass(config=SECTION)
class PlayConfig:
    """What `eval` and `collect` play: the environment, prompt options, how many episodes and
    how they are sampled (`eval.episodes` 0: every item of the split), and `run.seed`."""

    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(episodes=0, temperature=1.0))


PLAYED_SECTIONS = ("env", "rollout", "eval")
"""The sections of a run's config that say how its policy sees and plays the environment."""
