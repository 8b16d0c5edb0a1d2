"""Typed configs of the imitation trainers: `SFTConfig`, `DPOConfig`, `RFTConfig`.

They reuse the RL run's sections where the meaning is the same (`env`, `model`, `warmup`,
`rollout`, `optim`) and add their own. Loaded from YAML plus `key.sub=value` overrides by
`agentgym_rl.config.load_config`, with the same checks as the RL config (unknown keys and
wrong types are a `UserError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import EnvConfig, ModelConfig, WarmupConfig
from ..rollout.engine import RolloutConfig
from .learner import OptimConfig
from .sft import check_lr_schedule


def _at_least(owner: Any, minimum: float, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if value is not None and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass
class FinetuneConfig:
    """Supervised passes over conversations (SFT, and RFT's fine-tuning on its successes)."""

    epochs: int = 3
    batch_size: int = 16
    """Conversations per optimizer step; with packing, packed rows per optimizer step."""
    max_tokens: int = 4096
    """Leave out conversations longer than this (attention cost grows with length²)."""
    packing: bool = False
    """Pack several conversations into one row of at most `pack_tokens` tokens, with
    attention that stays inside each conversation (block-diagonal causal mask)."""
    pack_tokens: int = 2048
    lr_schedule: str = "constant"
    """"constant", or "cosine" (decay to 0 over each call's steps: each RFT round decays anew)."""
    lr_warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from 0."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "epochs", "batch_size", "max_tokens", "pack_tokens")
        check_lr_schedule(self.lr_schedule, self.lr_warmup_steps)


@dataclass
class SFTDataConfig:
    """Where SFT conversations come from: a file, or an environment's expert."""

    path: str | None = None
    """JSONL of AgentTraj, chat messages or our trajectories (the format is auto-detected)."""
    instruction_as_system: bool = False
    """AgentTraj only: make the first human turn the system message and drop AgentGym's
    acknowledgement turn (the layout of rollouts with `rollout.system_prompt: true`)."""
    env: str | None = None
    """Without `path`: play this environment's expert on the first `episodes` items of `split`."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    split: str = "train"
    episodes: int = 200
    max_turns: int | None = None
    """Turn limit of expert episodes (null: the environment's)."""
    successes_only: bool = False
    """Keep only conversations with success true (AgentGym's own AgentTraj files carry no
    success field: leave this false for them)."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "episodes", "max_turns")


@dataclass
class SFTConfig:
    """A supervised fine-tuning run (`agentgym-rl sft`)."""

    run_name: str = "sft"
    output_dir: str = "runs"
    seed: int = 0
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    """`path: null` builds the tiny model, its tokenizer trained on the first
    `corpus_episodes` conversations of the data."""
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(system_prompt=False))
    """Prompt options of expert collection (`system_prompt`); use the same at evaluation."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name


@dataclass
class EvalConfig:
    """Greedy evaluation on the first `episodes` items of `env.eval_split` (0 = none)."""

    episodes: int = 90
    max_turns: int | None = None
    """Turn limit (null: the environment's evaluation limit, BabyAI 20)."""
    temperature: float = 0.0

    def __post_init__(self) -> None:
        _at_least(self, 0, "episodes", "temperature")
        _at_least(self, 1, "max_turns")


@dataclass
class SampleConfig:
    """Sampling with the current policy: `samples_per_item` episodes on each of `items`
    training items drawn at random (seeded)."""

    items: int = 64
    samples_per_item: int = 4
    temperature: float = 1.0
    max_turns: int | None = None
    """Turn limit of sampled episodes (null: the environment's)."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "items", "samples_per_item", "max_turns")
        _at_least(self, 0, "temperature")


@dataclass
class DPODataConfig(SampleConfig):
    """Trajectories to pair: from `path`, or sampled with the current policy."""

    path: str | None = None
    """JSONL of scored trajectories (our trajectory JSONL, or AgentTraj / chat records with
    success and reward); null samples `samples_per_item` per item with the starting policy."""
    instruction_as_system: bool = False


@dataclass
class PairConfig:
    """How (chosen, rejected) pairs are made within an item (`train.pairs.build_pairs`)."""

    min_margin: float = 0.0
    use_reward: bool = True
    """Also pair equal outcomes by reward; false pairs only success against failure."""
    max_pairs_per_item: int | None = None

    def __post_init__(self) -> None:
        _at_least(self, 0, "min_margin")
        _at_least(self, 1, "max_pairs_per_item")


@dataclass
class DPOLossConfig:
    """The DPO objective and its passes over the pairs."""

    beta: float = 0.1
    label_smoothing: float = 0.0
    """ε of conservative DPO (0: plain DPO)."""
    epochs: int = 2
    batch_size: int = 8
    """Pairs per optimizer step."""
    max_tokens: int = 4096
    """Leave out pairs with a trajectory longer than this."""

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        _at_least(self, 1, "epochs", "batch_size", "max_tokens")


@dataclass
class DPOConfig:
    """A DPO run (`agentgym-rl dpo`)."""

    run_name: str = "dpo"
    output_dir: str = "runs"
    seed: int = 0
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Only with `model.path: null`: expert SFT of the tiny model before DPO, as in RL."""
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(system_prompt=False))
    data: DPODataConfig = field(default_factory=DPODataConfig)
    pairs: PairConfig = field(default_factory=PairConfig)
    dpo: DPOLossConfig = field(default_factory=DPOLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    """`micro_batch_size` counts rows, two per pair, so it must be even."""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(episodes=0))
    """Evaluate before and after DPO (episodes 0: not at all)."""

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name


@dataclass
class RFTRoundConfig(SampleConfig):
    """Rejection-sampling rounds: sample, keep the successes, fine-tune on them."""

    rounds: int = 1
    dedupe: bool = True
    """Keep one copy of identical successful episodes of an item (easy items otherwise
    dominate the data with repeats)."""
    keep_previous: bool = False
    """Fine-tune on the successes of all rounds so far, not only this round's."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least(self, 1, "rounds")


@dataclass
class RFTConfig:
    """A rejection-sampling fine-tuning run (`agentgym-rl rft`)."""

    run_name: str = "rft"
    output_dir: str = "runs"
    seed: int = 0
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """Only with `model.path: null`: expert SFT of the tiny model before the first round."""
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(system_prompt=False))
    rft: RFTRoundConfig = field(default_factory=RFTRoundConfig)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation before the first round and after every round (episodes 0: none)."""

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name
