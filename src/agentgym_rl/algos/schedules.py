"""Interaction-horizon schedules for ScalingInter-RL (AgentGym-RL, Xi et al. 2025).

ScalingInter-RL starts training with a short cap on interaction turns, so the agent
first learns to exploit short, reliable behaviour, then raises the cap on a monotone
schedule h_{t+1} = h_t + δ every Δ training steps so it learns longer exploration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .registry import SCHEDULE, lookup, register_schedule

KINDS = ("fixed", "stepwise")


@dataclass(frozen=True)
class HorizonSchedule:
    """Maximum number of interaction turns as a function of the training step.

    The horizon is a pure function of the step, so a run resumed from a checkpoint at
    step s lands on the right stage automatically: there is no schedule state to save.

    Attributes:
        kind: "fixed" (one horizon for all steps) or "stepwise" (stage k uses
            horizons[k]; the last horizon is held once reached).
        horizons: per-stage turn caps, positive and non-decreasing; a list is
            converted to a tuple.
        every: training steps per stage (Δ), ≥ 1; ignored by "fixed".

    Raises:
        ValueError: on an unknown kind, empty or non-integer horizons, non-positive or
            decreasing horizons, every < 1, or "fixed" with more than one horizon.
    """

    kind: str
    horizons: tuple[int, ...]
    every: int = 1

    def __post_init__(self) -> None:
        # Configs arrive as YAML lists; store a tuple so the dataclass stays hashable.
        object.__setattr__(self, "horizons", tuple(self.horizons))
        if self.kind not in KINDS:
            raise ValueError(f"unknown horizon schedule kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if not self.horizons:
            raise ValueError("horizon schedule needs at least one horizon")
        # bool is an int subclass; True as a horizon is almost surely a config mistake.
        if any(not isinstance(h, int) or isinstance(h, bool) for h in self.horizons):
            raise ValueError(f"horizons must be integers, got {list(self.horizons)}")
        if any(h < 1 for h in self.horizons):
            raise ValueError(f"horizons must be positive, got {list(self.horizons)}")
        if any(b < a for a, b in zip(self.horizons, self.horizons[1:])):
            raise ValueError(f"horizons must be non-decreasing, got {list(self.horizons)}")
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise ValueError(f"every (steps per stage) must be an integer >= 1, got {self.every!r}")
        if self.kind == "fixed" and len(self.horizons) != 1:
            raise ValueError(f"a fixed schedule takes exactly one horizon, got {list(self.horizons)}")

    @property
    def max_horizon(self) -> int:
        """The largest horizon ever used (the last one), e.g. to size buffers."""
        return self.horizons[-1]

    def stage(self, step: int) -> int:
        """Stage index for a 0-based training step: min(step // every, len − 1)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return min(step // self.every, len(self.horizons) - 1)

    def horizon(self, step: int) -> int:
        """Maximum interaction turns at a 0-based training step."""
        return self.horizons[self.stage(step)]

    @classmethod
    def arithmetic(cls, start: int, delta: int, stages: int, every: int) -> HorizonSchedule:
        """The paper's form h_{k+1} = h_k + δ: `stages` horizons start, start+δ, ....

        Example: arithmetic(6, 7, 3, 100) has horizons (6, 13, 20), changing every 100 steps.
        """
        if stages < 1:
            raise ValueError(f"stages must be >= 1, got {stages}")
        return cls("stepwise", tuple(start + k * delta for k in range(stages)), every)


@register_schedule("fixed")
def fixed_schedule(horizons: Sequence[int], every: int = 1) -> HorizonSchedule:
    """A constant horizon (the "fixed" baselines in the paper)."""
    return HorizonSchedule("fixed", tuple(horizons), every)


@register_schedule("stepwise")
def stepwise_schedule(horizons: Sequence[int], every: int = 1) -> HorizonSchedule:
    """Horizons that rise stage by stage every `every` steps (ScalingInter-RL)."""
    return HorizonSchedule("stepwise", tuple(horizons), every)


def from_config(kind: str, horizons: Sequence[int] | int, every: int = 1) -> HorizonSchedule:
    """Build a schedule from config values; a bare int means one horizon.

    Raises:
        ValueError: for an unknown kind or an invalid schedule (see `HorizonSchedule`).
    """
    values = (horizons,) if isinstance(horizons, int) else tuple(horizons)
    return lookup(SCHEDULE, kind, "horizon schedule kind")(values, every)
