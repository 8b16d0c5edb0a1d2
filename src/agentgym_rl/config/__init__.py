"""One config system: typed sections (run, env, model, rollout, optim, eval, ...) composed per
command, loaded from YAML with `key.sub=value` overrides (`load_config`), validated by pydantic.

Sections live in `sections`; the RL run's config in `rl`, the imitation trainers' in
`imitation`, `eval`'s and `collect`'s in `evaluation`; `loader` turns YAML and overrides into
them, with one-line errors.
"""

from .evaluation import PLAYED_SECTIONS, PlayConfig
from .imitation import (DPOConfig, DPODataConfig, DPOLossConfig, PairConfig, RFTConfig, RFTRoundConfig, SFTConfig,
                        SFTDataConfig)
from .loader import apply_override, from_dict, load_config, load_yaml, set_key, to_dict
from .rl import AlgoConfig, RLConfig, ScheduleConfig, TrainLoopConfig
from .sections import (EnvConfig, EvalConfig, FinetuneConfig, ModelConfig, OptimConfig, RolloutConfig, RunConfig,
                       SampleConfig, TinyModelConfig, TrainingRun, WarmupConfig)

__all__ = [
    "AlgoConfig", "DPOConfig", "DPODataConfig", "DPOLossConfig", "EnvConfig", "EvalConfig", "FinetuneConfig",
    "ModelConfig", "OptimConfig", "PLAYED_SECTIONS", "PairConfig", "PlayConfig", "RFTConfig", "RFTRoundConfig",
    "RLConfig", "RolloutConfig", "RunConfig", "SFTConfig", "SFTDataConfig", "SampleConfig", "ScheduleConfig",
    "TinyModelConfig", "TrainLoopConfig", "TrainingRun", "WarmupConfig", "apply_override", "from_dict",
    "load_config", "load_yaml", "set_key", "to_dict",
]
