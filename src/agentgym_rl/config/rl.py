"""The config of an online RL run (`agentgym-rl train`, `agentgym-rl quickstart`)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Annotated, Any, Literal, Optional

from pydantic import Field
from pydantic.dataclasses import dataclass

from ..algos import (SETTING_BOUNDS, SETTING_DOCS, SPEC_FIELDS, AlgorithmSpec, HorizonSchedule, advantage_inputs,
                     get_algorithm)
from .sections import SECTION, EvalConfig, NonNegative, NonNegativeFloat, Positive, PositiveFloat, TrainingRun


@dataclass(config=SECTION)
class AlgoRunConfig:
    """How an RL run uses its algorithm: the algorithm's name, the batch it plays each step and
    the guards of its update. `AlgoConfig` adds the recipe's hyper-parameters."""

    name: str = "grpo"
    """gigpo, grpo, loop, ppo, reinforce++ or rloo (`agentgym-rl algos`)."""
    tasks_per_step: Positive = 8
    """Distinct tasks per RL step."""
    group_size: Positive = 8
    """Samples per task (the group of GRPO, GiGPO, RLOO and LOOP, which need at least 2)."""
    temperature: PositiveFloat = 1.0
    """Sampling temperature of the rollouts; the learner scores softmax(logits / temperature),
    the policy that sampled them."""
    greedy_samples: NonNegative = 0
    """Of each group's `group_size` samples, how many (the first) are played greedily, as a
    greedy evaluation plays the task, the others sampled at `temperature`. A small instruct
    model's greedy replies repeat a failed one turn after turn (docs/RESULTS.md); in a group
    another sample solved, the greedy episode's advantage is negative on the very tokens greedy
    decoding picks. Their log-probabilities are those of softmax(logits / temperature), as the
    learner scores them. Needs a generator in this process (`rollout.generator`: hf or slots)."""
    minibatch_size: Positive = 64
    """Trajectories per optimizer step."""
    kl_control: Literal["fixed", "adaptive"] = "fixed"
    """"fixed" β, or "adaptive" (Ziegler et al. 2019): β moves to keep the KL near kl_target."""
    kl_target: PositiveFloat = 0.01
    """The KL the adaptive controller steers β towards (`kl_control: adaptive`)."""
    kl_horizon: Positive = 10000
    """The adaptive controller's horizon: with this many steps one update moves β by up to 20%."""
    max_kl: NonNegativeFloat = 0.0
    """Skip (and log) an optimizer step whose approximate KL to the sampling policy exceeds
    this (0: never skip)."""
    skip_zero_advantage: bool = True
    """Leave rows whose advantage is zero on every token out of the update when no KL, value
    or entropy term needs them (as DAPO's dynamic sampling does). They add nothing to the
    policy gradient's sum, but with token-mean aggregation they count in its denominator: a
    step that keeps a quarter of its tokens takes a gradient 4x larger per token than with
    false (before clipping and Adam's normalisation). False keeps every row, e.g. to compare
    runs at equal cost."""
    recompute_old_logprobs: bool = True
    """Score the rollouts with the learner before updating, instead of trusting the
    generator's logprobs (they differ when generation runs elsewhere, e.g. vLLM). An update of
    one optimizer step (one epoch, every kept row in one minibatch) reads them from that step's
    own forward pass instead of a pass of their own: the same weights, so the same values."""
    without_state_keys: bool = False
    """Let an algorithm whose advantage has a step level that groups turns by their true state
    (gigpo) run on an environment that names no states (`info["state_key"]`; a mix: any member;
    any environment on AgentGym's own servers, `agentgym+` in `env.urls`): the step level is
    then 0 and it trains on the episode level alone. False refuses such a run before any work."""
    dynamic_sampling: NonNegative = 0
    """Refill rounds of DAPO's dynamic sampling (0: off). A group whose rewards all tie has no
    advantage; after the step's groups are played, as many new tasks as there are such groups
    short of `tasks_per_step` with a reward spread are played, up to this many times. The tied
    groups stay in the batch (their rows are left out of the update by skip_zero_advantage,
    unless a KL term, a token penalty or gigpo's step level keeps them; `dynamic_sampling_filter`
    drops them, as DAPO does); `sampling/*` metrics
    count the extra groups. Only for the algorithms that compare a task's samples (grpo, gigpo,
    rloo, loop)."""
    dynamic_sampling_filter: bool = False
    """DAPO's filter over the groups a step played (with or without refill rounds): the update
    trains only on the first `tasks_per_step` groups whose rewards differ, dropping the tied ones
    (even where a token penalty or gigpo's step level would give them a signal) and any beyond,
    so the batch keeps its size; `sampling/groups_dropped` counts them. The step's success,
    reward and saved episodes still cover every group played (`filter_keeps_rare_actions` lets
    tied groups with a rare action in). False (the default): every group is in the batch, as in
    the runs RESULTS records."""
    filter_keeps_rare_actions: bool = False
    """With `dynamic_sampling_filter` and `rare_action_bonus`: a tied group in which an action's
    verb is rare over all the step's episodes (those an update can train on) has a signal too
    (the bonus), so the filter keeps such groups where places are left after the groups whose
    rewards differ (in the order they were played; `sampling/rare_action_groups` counts them),
    and the bonus counts verbs over all those episodes, not only the kept ones: in the groups
    whose rewards differ too. False (the default): the filter keeps only groups whose rewards
    differ, and the bonus counts over those (RESULTS' filter run)."""

    def __post_init__(self) -> None:
        spec = self.spec()  # an unknown name or a value the recipe cannot take fails here
        if spec.tis_cap is not None and not self.recompute_old_logprobs:
            raise ValueError("tis_cap needs recompute_old_logprobs: true (without the learner's own scoring "
                             "the generator's logprobs are the old ones and every weight would be 1)")
        grouped = "group_ids" in advantage_inputs(spec.advantage)[0]
        if self.dynamic_sampling_filter and not grouped:
            raise ValueError(f"dynamic_sampling_filter keeps groups whose rewards differ; {self.name}'s advantage "
                             "does not compare a task's samples (use grpo, gigpo, rloo or loop)")
        if self.filter_keeps_rare_actions and not (self.dynamic_sampling_filter and spec.rare_action_bonus):
            raise ValueError("filter_keeps_rare_actions changes what DAPO's filter keeps for the exploration bonus: "
                             "it needs dynamic_sampling_filter: true and a rare_action_bonus > 0")
        if self.dynamic_sampling and not grouped:
            raise ValueError(f"dynamic_sampling refills groups whose rewards tie; {self.name}'s advantage does not "
                             "compare a task's samples (use grpo, gigpo, rloo or loop, or dynamic_sampling: 0)")
        if self.greedy_samples >= self.group_size:
            raise ValueError(f"greedy_samples ({self.greedy_samples}) must leave a sampled episode in each group of "
                             f"{self.group_size}: lower it or raise group_size")
        if grouped and self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for {self.name}: its advantage compares the samples of "
                             f"a task, and a group of {self.group_size} has nothing to compare (no update at all)")

    def spec(self) -> AlgorithmSpec:
        """The algorithm's recipe with this config's non-null settings put over its defaults."""
        changes = {name: getattr(self, name) for name in SPEC_FIELDS if getattr(self, name, None) is not None}
        return dataclasses.replace(get_algorithm(self.name), **changes)


def _setting_field(name: str, annotation: Any) -> tuple[str, Any, Any]:
    """An `AlgoConfig` field for the recipe setting `name`: its type and bounds, null by default
    (the algorithm's own value), its description from the recipe."""
    bounds = SETTING_BOUNDS[name]
    if bounds:
        annotation = Annotated[annotation, Field(**bounds)]
    doc = SETTING_DOCS[name]
    if "null" not in doc:  # else the doc says what null means (every recipe's default there)
        doc += " null: the algorithm's own (`agentgym-rl algos --settings`)."
    return name, Optional[annotation], Field(default=None, description=doc)


def _algo_config() -> type:
    """`AlgoRunConfig` plus one field per recipe setting: every hyper-parameter of the recipes is
    declared once, in `algos.AlgorithmSpec`."""
    hints = typing.get_type_hints(AlgorithmSpec)
    cls = dataclasses.make_dataclass("AlgoConfig", [_setting_field(name, hints[name]) for name in SETTING_DOCS],
                                     bases=(AlgoRunConfig,))
    cls.__module__ = __name__
    return dataclass(config=SECTION)(cls)


AlgoConfig = _algo_config()
AlgoConfig.__doc__ = """The RL algorithm (names as `agentgym-rl algos` prints) and its settings. The settings
(clip_eps, kl_coef, gamma, ...) are the recipe's hyper-parameters, declared with their defaults
in `agentgym_rl.algos.presets.AlgorithmSpec`; left null they take the algorithm's own."""


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
class CurriculumConfig:
    """Which tasks of `env.train_split` a step draws (`train/curriculum.py`)."""

    kind: Literal["split", "success"] = "split"
    """split: `algo.tasks_per_step` distinct tasks drawn evenly from the split, each category in
    its share of the split. success: each task's category drawn by the chance that a group of
    `algo.group_size` samples of it differs in success, 1 - p^G - (1-p)^G, p the category's success
    rate in the training episodes so far, mixed with an even share (`explore`); the shares and
    rates are logged as `curriculum/share/<category>` and `curriculum/success/<category>`.
    Refills of `algo.dynamic_sampling` draw the same way."""
    memory: Annotated[float, Field(ge=0, lt=1)] = 0.7
    """success: the weight an earlier step's episodes keep in the rates, multiplied in each step
    (0: the last step's alone)."""
    explore: Annotated[float, Field(ge=0, le=1)] = 0.2
    """success: the share of draws spread evenly over the categories, so that none is starved
    (1: every category equally often)."""
    categories: list[str] = field(default_factory=list)
    """Train only on tasks of these categories of `env.train_split` (empty: all of them), e.g.
    `["GoTo"]` on BabyAI or `["depth 1"]` on TextCraft (a name the split lacks is refused, with
    the ones it has); in a mix, named with their environment (`babyai/GoTo`). Validation is
    unaffected: it plays the `eval` section's items."""


@dataclass(config=SECTION)
class TrainLoopConfig:
    """Length of training and how often to validate, log and save."""

    steps: Positive = 300
    """RL steps (each plays `algo.tasks_per_step` x `algo.group_size` episodes and updates)."""
    validate_every: NonNegative = 50
    """Evaluate on held-out items (the `eval` section) every k steps, before the first and
    after the last (0 disables)."""
    save_every: NonNegative = 100
    """Write a checkpoint every k steps, and after the last. 0 writes none: a quick run of a
    real model then leaves no 1.5 GB checkpoint (SmolLM2's weights and AdamW state), and can be
    neither resumed nor evaluated with `eval --run`."""
    keep_checkpoints: NonNegative = 0
    """Keep only the newest k checkpoints, deleting older ones after each save (0 keeps all).
    SmolLM2's take ~1.6 GB each with the AdamW state: `train.save_every=1` on a long run fills
    a disk without it."""
    time_limit_min: NonNegativeFloat = 0.0
    """Stop after the first step that ends this many minutes after training began (0: no
    limit), as if it were the last: it saves and (when `validate_every` is set) validates, and
    `train --resume` goes on from it, with the limit counted afresh. For jobs with a wall-time
    limit: the step in progress, the validation and the save still run past it (see
    `time_limit_mode`)."""
    time_limit_mode: Literal["after", "within"] = "after"
    """How `time_limit_min` is kept. after: stop after the first step that ends past it. within:
    stop after the step after which one more step (the last one's time, scaled by the next
    step's horizon), the last validation and the save would end past it, each as this invocation
    last timed it, so that the run ends near the limit, not a step and a validation after it
    (`make demo`'s 10 minutes on a slow CPU). What it has not timed yet (a resumed run's first
    validation, a step-0 validation read from `baseline`) it counts as 0 s."""
    save_trajectories: bool = True
    """Write every step's rollouts to `trajectories/` and every validation's to `validation/`."""
    baseline: str | None = None
    """A step-0 validation file to take instead of playing step 0 again: another run's
    `validation/step_000000.jsonl` with the same model, items and settings (e.g. an earlier seed
    of a study: a greedy validation does not depend on the seed). The run plays the first turn of
    every item and refuses the file unless each first reply is the one it holds (`train/baseline.py`),
    and unless the turn limit, context and reply limits and env settings it was played with were
    this run's: read from its run folder, or, for a copy kept elsewhere, from the settings file
    `bench/keep_baseline.py` writes beside it (a copy without one is taken on trust for those,
    and the log says so). Greedy validation only (`eval.temperature=0`)."""
    asynchronous: bool = False
    """Play the next steps' rollouts in a thread while the learner updates, from weights at most
    `rollout.max_staleness` updates old (`train/asynchronous.py`); the generator keeps its own
    copy of the trainable weights. Not with torchrun, Ray workers or the vLLM generator yet."""
    partial_rollouts: bool = False
    """With `asynchronous`: the generator loads weights the learner published between two turns
    of a step too, not only between steps, and its episodes in flight go on under them (their KV
    caches are dropped and each conversation prefilled again under the new weights). Each turn
    records the version that wrote it (`Trajectory.turn_versions`); `async/turn_staleness_*`
    count versions per turn; the learner recomputes the old logprobs (`algo.recompute_old_logprobs`,
    which partial rollouts need) and `algo.tis_cap` weighs each token by the generator that wrote it."""

    def __post_init__(self) -> None:
        if self.partial_rollouts and not self.asynchronous:
            raise ValueError("partial_rollouts loads new weights while rollouts are played ahead: it needs "
                             "asynchronous: true")


@dataclass(config=SECTION)
class RLConfig(TrainingRun):
    """A whole RL run."""

    eval: EvalConfig = field(default_factory=lambda: EvalConfig(episodes=30))
    """Validation during training, on the first `episodes` items of `env.eval_split`."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
