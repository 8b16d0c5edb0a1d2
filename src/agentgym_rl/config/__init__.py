"""One config system: typed sections (run, env, model, rollout, optim, eval, ...) composed per
command, loaded from YAML with `key.sub=value` overrides (`load_config`), validated by pydantic.

Sections live in `sections`; the RL run's config in `rl`, the imitation trainers' in
`imitation`, `eval`'s and `collect`'s in `evaluation`; `loader` turns YAML and overrides into
them, with one-line errors.
"""

import importlib

# The name each submodule exports here. They load on first use (PEP 562), so that a module
# needing only `sections` (an environment's task list, an env server) does not import `rl`,
# whose algorithm registry imports torch: `serve-env` started in 4.6 s with it, 1.5 s without.
_EXPORTS = {
    "evaluation": ("PLAYED_SECTIONS", "PlayConfig"),
    "imitation": ("DPOConfig", "DPODataConfig", "DPOLossConfig", "PairConfig", "RFTConfig", "RFTRoundConfig",
                  "SFTConfig", "SFTDataConfig"),
    "loader": ("apply_override", "dump_yaml", "from_dict", "load_config", "load_yaml", "set_key", "to_dict"),
    "rl": ("AlgoConfig", "CurriculumConfig", "RLConfig", "ScheduleConfig", "TrainLoopConfig"),
    "sections": ("DEFAULT_DEVICE", "EnvConfig", "EvalConfig", "FinetuneConfig", "ModelConfig", "OptimConfig",
                 "RolloutConfig",
                 "RunConfig", "SampleConfig", "TinyModelConfig", "TrainingRun", "WarmupConfig"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = sorted(_MODULE_OF)
