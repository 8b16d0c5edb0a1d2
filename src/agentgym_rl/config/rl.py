"""The config of an online RL run (`agentgym-rl train`, `agentgym-rl quickstart`)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from ..algos import SPEC_FIELDS, AlgorithmSpec, HorizonSchedule, advantage_inputs, get_algorithm
from .sections import SECTION, EvalConfig, NonNegative, NonNegativeFloat, Positive, PositiveFloat, TrainingRun


@dataclass(config=SECTION)
class AlgoConfig:
    """The RL algorithm (names as `agentgym-rl algos` prints). Fields left null take the
    algorithm's own default (`agentgym_rl.algos.presets`)."""

    name: str = "grpo"
    """gigpo, grpo, loop, ppo, reinforce++ or rloo (`agentgym-rl algos`)."""
    tasks_per_step: Positive = 8
    """Distinct tasks per RL step."""
    group_size: Positive = 8
    """Samples per task (the group of GRPO, RLOO and LOOP, which need at least 2)."""
    temperature: PositiveFloat = 1.0
    """Sampling temperature of the rollouts; the learner scores softmax(logits / temperature),
    the policy that sampled them."""
    minibatch_size: Positive = 64
    """Trajectories per optimizer step."""
    clip_eps: PositiveFloat | None = None
    """PPO's clip range ε of the importance ratio."""
    clip_eps_high: PositiveFloat | None = None
    """Upper clip range ε_high ("clip-higher", DAPO: e.g. 0.28 with ε = 0.2): a token whose
    advantage is positive may raise its ratio up to 1 + ε_high, so rare tokens that paid off
    can grow. null: the recipe's, which is ε."""
    normalize_std: bool | None = None
    """grpo: divide by the group's standard deviation."""
    drop_threshold: NonNegativeFloat | None = None
    """loop: drop rollouts whose |advantage| is below this."""
    gamma: Annotated[float, Field(ge=0, le=1)] | None = None
    """Discount per action token (ppo's GAE, reinforce++), per turn (gigpo)."""
    lam: Annotated[float, Field(ge=0, le=1)] | None = None
    """GAE's λ (ppo)."""
    step_weight: NonNegativeFloat | None = None
    """gigpo: weight ω of the step-level advantage (turns from the same state compared)."""
    whiten: bool | None = None
    """ppo: normalise the advantages over the batch's action tokens."""
    kl_coef: NonNegativeFloat | None = None
    """Weight of the KL to the reference policy (0: no reference is kept)."""
    kl_estimator: str | None = None
    """How the per-token KL to the reference is estimated: k1, k2 or k3 (Schulman's estimators)."""
    kl_control: Literal["fixed", "adaptive"] = "fixed"
    """"fixed" β, or "adaptive" (Ziegler et al. 2019): β moves to keep the KL near kl_target."""
    kl_target: PositiveFloat = 0.01
    """The KL the adaptive controller steers β towards (`kl_control: adaptive`)."""
    kl_horizon: Positive = 10000
    """The adaptive controller's horizon: with this many steps one update moves β by up to 20%."""
    ratio_level: str | None = None
    """Importance ratio per "token", "turn" or "trajectory" (LOOP's ablation)."""
    aggregation: str | None = None
    """How token losses become one: token-mean, seq-mean-token-mean or seq-mean-token-sum."""
    epochs: Positive | None = None
    """Passes over each batch of rollouts."""
    value_coef: NonNegativeFloat = 0.5
    """ppo: weight of the value loss."""
    entropy_coef: NonNegativeFloat = 0.0
    """Weight of the entropy bonus (0: off)."""
    max_kl: NonNegativeFloat = 0.0
    """Skip (and log) an optimizer step whose approximate KL to the sampling policy exceeds
    this (0: never skip)."""
    skip_zero_advantage: bool = True
    """Leave rows whose advantage is zero on every token out of the update when no KL loss
    or value term needs them: they add nothing to the policy gradient, only compute (as in
    DAPO's dynamic sampling). False keeps every row, e.g. to compare runs at equal cost."""
    invalid_turn_penalty: NonNegativeFloat | None = None
    """null: every turn shares its trajectory's advantage A. A number p >= 0: a turn whose
    action the environment rejected gets min(A, 0) instead (such an action changed nothing,
    so a good outcome cannot credit it) from the token where its action first left every
    available action, and that token gets a further -p (`algos.discredit_turns`,
    `algos.penalize_tokens`)."""
    right_token_coef: NonNegativeFloat = 0.0
    """Weight of `algos.right_token_loss`: at the token where a rejected reply left every
    available action, raise the total probability of the tokens that would have continued
    one (0: off; never at the action's first token, `envs.parsing.right_next_tokens`). Like
    the penalty above, it needs the wrong tokens located."""
    recompute_old_logprobs: bool = True
    """Score the rollouts with the learner before updating, instead of trusting the
    generator's logprobs (they differ when generation runs elsewhere, e.g. vLLM)."""
    dynamic_sampling: NonNegative = 0
    """Refill rounds of DAPO's dynamic sampling (0: off). A group whose rewards all tie has no
    advantage; after the step's groups are played, as many new tasks as there are such groups
    short of `tasks_per_step` with a reward spread are played, up to this many times. The tied
    groups stay in the batch (their rows are left out of the update by skip_zero_advantage,
    unless a token penalty gives them a signal); `sampling/*` metrics count the extra groups.
    Only for the algorithms that compare a task's samples (grpo, rloo, loop)."""
    tis_cap: PositiveFloat | None = None
    """Truncated importance sampling (`algos.truncated_is_weights`): weight each token's
    policy term by min(π_learner/π_generator, tis_cap), correcting for a generator that is
    not the learner (vLLM, bfloat16, another thread count; `rollout/logprob_gap_*` shows the
    gap). Needs recompute_old_logprobs. null: off; 2 is a common cap."""

    def __post_init__(self) -> None:
        spec = self.spec()  # an unknown name or a value the recipe cannot take fails here
        if self.tis_cap is not None and not self.recompute_old_logprobs:
            raise ValueError("tis_cap needs recompute_old_logprobs: true (without the learner's own scoring "
                             "the generator's logprobs are the old ones and every weight would be 1)")
        grouped = "group_ids" in advantage_inputs(spec.advantage)[0]
        if self.dynamic_sampling and not grouped:
            raise ValueError(f"dynamic_sampling refills groups whose rewards tie; {self.name}'s advantage does not "
                             "compare a task's samples (use grpo, rloo or loop, or dynamic_sampling: 0)")
        if grouped and self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for {self.name}: its advantage compares the samples of "
                             f"a task, and a group of {self.group_size} has nothing to compare (no update at all)")

    def spec(self) -> AlgorithmSpec:
        """The algorithm's recipe with this config's non-null fields put over its defaults: a
        field here with the name of a recipe field (`algos.SPEC_FIELDS`) overrides it. A new
        hyper-parameter is a field of `AlgorithmSpec` (its default), one here (null, with its
        description) and a keyword of the estimator or loss that takes it (by that name)."""
        changes = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if f.name in SPEC_FIELDS and getattr(self, f.name) is not None}
        return dataclasses.replace(get_algorithm(self.name), **changes)


@dataclass(config=SECTION)
class ScheduleConfig:
    """ScalingInter-RL horizon schedule: `horizons[i]` turns during stage i."""

    kind: str = "stepwise"
    """fixed (one horizon throughout) or stepwise (stage k plays `horizons[k]` turns)."""
    horizons: list[Positive] = field(default_factory=lambda: [6, 13, 20])
    """Turn limit of each stage, non-decreasing; the last is kept once reached."""
    every: Positive = 100
    """Training steps per stage (stepwise)."""

    def __post_init__(self) -> None:
        HorizonSchedule(self.kind, tuple(self.horizons), self.every)  # an unknown kind fails here


@dataclass(config=SECTION)
class TrainLoopConfig:
    """Length of training and how often to validate, log and save."""

    steps: Positive = 300
    """RL steps (each plays `algo.tasks_per_step` x `algo.group_size` episodes and updates)."""
    validate_every: NonNegative = 50
    """Evaluate on held-out items (the `eval` section) every k steps, and before the first
    (0 disables)."""
    save_every: Positive = 100
    """Write a checkpoint every k steps, and after the last."""
    save_trajectories: bool = True
    """Write every step's rollouts to `trajectories/` and every validation's to `validation/`."""


@dataclass(config=SECTION)
class RLConfig(TrainingRun):
    """A whole RL run."""

    eval: EvalConfig = field(default_factory=lambda: EvalConfig(episodes=30))
    """Validation during training, on the first `episodes` items of `env.eval_split`."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
