"""Typed dataclass configs loaded from YAML, with `key.sub=value` overrides.

Each component owns its config dataclass; this module only composes them and converts
YAML data into them, rejecting unknown keys and wrong types with a `UserError`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .agent.tiny import TinyModelConfig
from .errors import UserError
from .rollout.engine import RolloutConfig
from .train.learner import OptimConfig
from .train.sft import check_lr_schedule


@dataclass
class EnvConfig:
    """Which environment and splits."""

    id: str = "babyai"
    train_split: str = "train"
    eval_split: str = "test"
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments of the environment (e.g. BabyAI's `list_actions: false`)."""
    invalid_action_penalty: float = 0.0
    """RL training only: subtract this from the reward of each step the environment marks
    invalid (`envs.wrappers.InvalidActionPenalty`). Validation and evaluation keep the
    environment's own reward."""


@dataclass
class ModelConfig:
    """The policy model."""

    path: str | None = None
    """A local Hugging Face model folder; null builds the tiny offline model."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the tiny model (used when `path` is null)."""
    corpus_episodes: int = 200
    """Expert episodes whose text trains the tiny model's tokenizer."""
    lora_rank: int = 0
    """RL trains a LoRA adapter of this rank (0: all weights). With LoRA the KL reference is
    the base model with the adapter off, so no second copy is kept."""
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=list)
    """Module names to adapt; empty adapts every linear layer but the output head."""


@dataclass
class WarmupConfig:
    """Supervised warm-up on expert demonstrations before RL (0 episodes = none)."""

    episodes: int = 0
    epochs: int = 3
    lr: float = 2e-3
    batch_size: int = 16
    max_tokens: int = 4096
    """Skip demonstrations longer than this (attention cost grows with the square of length)."""
    lr_schedule: str = "cosine"
    """"cosine" (decay to 0 over the warm-up's steps) or "constant". On a constant 4e-3 the
    tiny model's loss stopped falling at ~0.31 (format learnt, observations ignored)."""
    lr_warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from 0."""
    thoughts: bool = True
    """Keep the demonstrations' ReAct thoughts. False trains replies of the `Action:` line alone:
    a templated thought (BabyAI's) adds no information but doubles the tokens generated per turn."""

    def __post_init__(self) -> None:
        check_lr_schedule(self.lr_schedule, self.lr_warmup_steps)


@dataclass
class AlgoConfig:
    """The RL algorithm (names as `agentgym-rl algos` prints). Fields left null take the
    algorithm's own default (`agentgym_rl.algos.presets`)."""

    name: str = "grpo"
    tasks_per_step: int = 8
    """Distinct tasks per RL step."""
    group_size: int = 8
    """Samples per task (the group of GRPO, RLOO and LOOP)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts; the learner scores softmax(logits / temperature),
    the policy that sampled them."""
    minibatch_size: int = 64
    """Trajectories per optimizer step."""
    clip_eps: float | None = None
    normalize_std: bool | None = None
    """grpo: divide by the group's standard deviation."""
    drop_threshold: float | None = None
    """loop: drop rollouts whose |advantage| is below this."""
    gamma: float | None = None
    lam: float | None = None
    whiten: bool | None = None
    kl_coef: float | None = None
    """Weight of the KL to the reference policy (0: no reference is kept)."""
    kl_estimator: str | None = None
    kl_control: str = "fixed"
    """"fixed" β, or "adaptive" (Ziegler et al. 2019): β moves to keep the KL near kl_target."""
    kl_target: float = 0.01
    kl_horizon: int = 10000
    ratio_level: str | None = None
    """Importance ratio per "token", "turn" or "trajectory" (LOOP's ablation)."""
    aggregation: str | None = None
    epochs: int | None = None
    """Passes over each batch of rollouts."""
    value_coef: float = 0.5
    """ppo: weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: off)."""
    max_kl: float = 0.0
    """Skip (and log) an optimizer step whose approximate KL to the sampling policy exceeds
    this (0: never skip)."""
    skip_zero_advantage: bool = True
    """Leave rows whose advantage is zero on every token out of the update when no KL loss
    or value term needs them: they add nothing to the policy gradient, only compute (as in
    DAPO's dynamic sampling). False keeps every row, e.g. to compare runs at equal cost."""
    invalid_turn_penalty: float | None = None
    """null: every turn shares its trajectory's advantage A. A number p >= 0: a turn whose
    action the environment rejected gets min(A, 0) instead (such an action changed nothing,
    so a good outcome cannot credit it) from the token where its action first left every
    available action, and that token gets a further -p (`algos.discredit_turns`,
    `algos.penalize_tokens`)."""
    right_token_coef: float = 0.0
    """Weight of `algos.right_token_loss`: at the token where a rejected reply left every
    available action, raise the total probability of the tokens that would have continued
    one (0: off; never at the action's first token, `envs.parsing.right_next_tokens`). Like
    the penalty above, it needs the wrong tokens located."""
    recompute_old_logprobs: bool = True
    """Score the rollouts with the learner before updating, instead of trusting the
    generator's logprobs (they differ when generation runs elsewhere, e.g. vLLM)."""

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"algo.temperature must be > 0 (RL samples its rollouts), got {self.temperature}")
        if self.invalid_turn_penalty is not None and self.invalid_turn_penalty < 0:
            raise ValueError(f"algo.invalid_turn_penalty must be >= 0 or null, got {self.invalid_turn_penalty}")
        if self.right_token_coef < 0:
            raise ValueError(f"algo.right_token_coef must be >= 0, got {self.right_token_coef}")


@dataclass
class ScheduleConfig:
    """ScalingInter-RL horizon schedule: `horizons[i]` turns during stage i."""

    kind: str = "stepwise"
    horizons: list[int] = field(default_factory=lambda: [6, 13, 20])
    every: int = 100


@dataclass
class TrainLoopConfig:
    """Length of training and how often to validate, log and save."""

    steps: int = 300
    validate_every: int = 50
    """Evaluate on held-out items every k steps (0 disables)."""
    validation_episodes: int = 30
    validation_max_turns: int | None = None
    """Turn limit of validation; null uses the environment's evaluation limit (BabyAI: 20)."""
    validation_temperature: float = 0.0
    """Sampling temperature of validation (0 = greedy: no sampling noise in the estimate)."""
    save_every: int = 100
    save_trajectories: bool = True
    """Write every step's rollouts to `trajectories/` and every validation's to `validation/`."""


@dataclass
class TrainConfig:
    """A whole RL run."""

    run_name: str = "run"
    output_dir: str = "runs"
    seed: int = 0
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name


def _convert(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise UserError(f"config key '{where}' must be a mapping, got {value!r}")
        return from_dict(annotation, value, where)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, where)
            except UserError as error:
                errors.append(str(error))
        raise UserError(errors[0] if errors else f"config key '{where}' has a bad value {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"config key '{where}' must be a list, got {value!r}")
        (item_type, *_) = typing.get_args(annotation) or (Any,)
        return origin(_convert(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"config key '{where}' must be a mapping, got {value!r}")
        return dict(value)
    if annotation is bool:
        if not isinstance(value, bool):
            raise UserError(f"config key '{where}' must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"config key '{where}' must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str):
            # YAML 1.1 reads exponents without a dot ("1e-5") as strings.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"config key '{where}' must be a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise UserError(f"config key '{where}' must be a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from nested dicts; unknown keys and wrong types raise UserError."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise UserError(f"unknown config key '{key}'; known here: {', '.join(sorted(names))}")
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as error:
        raise UserError(f"bad config{' in ' + where if where else ''}: {error}") from None


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override in place; the value is parsed as YAML."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override {override!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise UserError(f"override {override!r}: the value is not valid YAML") from None
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"override {override!r}: '{part}' is not a section")
    node[parts[-1]] = value


def load_yaml(path: str | Path) -> dict[str, Any]:
    source = Path(path)
    if not source.is_file():
        raise UserError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(source.read_text()) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"config file {str(path)!r}{line} is not valid YAML") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


C = typing.TypeVar("C")


def load_config(cls: type[C], path: str | Path | None, overrides: list[str] = ()) -> C:
    """Load a config dataclass `cls` from YAML (defaults when `path` is None) plus overrides."""
    data = load_yaml(path) if path is not None else {}
    for override in overrides:
        apply_override(data, override)
    return from_dict(cls, data)


def load_train_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Load an RL run's `TrainConfig` (see `load_config`)."""
    return load_config(TrainConfig, path, overrides)

