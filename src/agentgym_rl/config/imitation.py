"""The configs of the imitation trainers: SFT, DPO and rejection-sampling fine-tuning."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass

from .sections import (SECTION, EnvConfig, EvalConfig, FinetuneConfig, ModelConfig, NonNegativeFloat, OptimConfig,
                       Positive, PositiveFloat, RolloutConfig, RunConfig, SampleConfig, TrainingRun)


@dataclass(config=SECTION)
class SFTDataConfig:
    """Where SFT conversations come from: a file, or else the expert of `env.id` on the first
    `episodes` items of `env.train_split`."""

    path: str | None = None
    """JSONL of AgentTraj, chat messages or our trajectories (the format is auto-detected)."""
    instruction_as_system: bool = False
    """AgentTraj only: make the first human turn the system message and drop AgentGym's
    acknowledgement turn (the layout of rollouts with `rollout.system_prompt: true`)."""
    episodes: Positive = 200
    """Without `path`: expert episodes to play."""
    max_turns: Positive | None = None
    """Turn limit of expert episodes (null: the environment's)."""
    successes_only: bool = False
    """Keep only conversations with success true (AgentGym's own AgentTraj files carry no
    success field: leave this false for them)."""


@dataclass(config=SECTION)
class SFTConfig:
    """A supervised fine-tuning run (`agentgym-rl sft`)."""

    run: RunConfig = field(default_factory=lambda: RunConfig(name="sft"))
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment the data is about: its expert plays the data when `data.path` is null,
    and its settings travel with the run (`eval --run`)."""
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    """`path: null` builds the tiny model, its tokenizer trained on the first
    `corpus_episodes` conversations of the data."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Prompt options of expert collection (`system_prompt`); evaluation uses the same."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(episodes=0))
    """Evaluate after training (episodes 0: not at all)."""


@dataclass(config=SECTION)
class DPODataConfig(SampleConfig):
    """Trajectories to pair: from `path`, or sampled with the current policy."""

    path: str | None = None
    """JSONL of scored trajectories (our trajectory JSONL, or AgentTraj / chat records with
    success and reward); null samples `samples_per_item` per item with the starting policy."""
    instruction_as_system: bool = False
    """AgentTraj records in `path`: the first human turn becomes the system message."""


@dataclass(config=SECTION)
class PairConfig:
    """How (chosen, rejected) pairs are made within an item (`train.pairs.build_pairs`)."""

    min_margin: NonNegativeFloat = 0.0
    """Between equal outcomes, the smallest reward gap that makes a pair."""
    use_reward: bool = True
    """Also pair equal outcomes by reward; false pairs only success against failure."""
    max_pairs_per_item: Positive | None = None
    """Most pairs kept per item (null: all)."""


@dataclass(config=SECTION)
class DPOLossConfig:
    """The DPO objective and its passes over the pairs."""

    beta: PositiveFloat = 0.1
    """DPO's β: how far the policy may move from the reference to fit the preferences."""
    label_smoothing: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    """ε of conservative DPO (0: plain DPO)."""
    epochs: Positive = 2
    """Passes over the pairs."""
    batch_size: Positive = 8
    """Pairs per optimizer step."""
    max_tokens: Positive = 4096
    """Leave out pairs with a trajectory longer than this."""


@dataclass(config=SECTION)
class DPOConfig(TrainingRun):
    """A DPO run (`agentgym-rl dpo`). `optim.micro_batch_size` counts rows, two per pair, so it
    must be even; `eval` runs before and after DPO (episodes 0: not at all)."""

    run: RunConfig = field(default_factory=lambda: RunConfig(name="dpo"))
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(episodes=0))
    data: DPODataConfig = field(default_factory=DPODataConfig)
    pairs: PairConfig = field(default_factory=PairConfig)
    dpo: DPOLossConfig = field(default_factory=DPOLossConfig)

    def __post_init__(self) -> None:
        if self.optim.micro_batch_size % 2:
            raise ValueError(f"optim.micro_batch_size must be even for DPO (a micro-batch holds whole chosen/rejected "
                             f"pairs, two rows each); got {self.optim.micro_batch_size}")


@dataclass(config=SECTION)
class RFTRoundConfig(SampleConfig):
    """Rejection-sampling rounds: sample, keep the successes, fine-tune on them."""

    rounds: Positive = 1
    """Rounds of sampling then fine-tuning, each from the model the last one left."""
    dedupe: bool = True
    """Keep one copy of identical successful episodes of an item (easy items otherwise
    dominate the data with repeats)."""
    keep_previous: bool = False
    """Fine-tune on the successes of all rounds so far, not only this round's."""


@dataclass(config=SECTION)
class RFTConfig(TrainingRun):
    """A rejection-sampling fine-tuning run (`agentgym-rl rft`); `eval` runs before the first
    round and after every round (episodes 0: none)."""

    run: RunConfig = field(default_factory=lambda: RunConfig(name="rft"))
    rft: RFTRoundConfig = field(default_factory=RFTRoundConfig)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
