"""Pieces the imitation trainers share with each other (and the RL trainer's conventions):
the run folder, LoRA wrapping, model policies, evaluation and checkpoints."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ..agent.lora import apply_lora
from ..config import EnvConfig, EvalConfig, RolloutConfig
from ..envs import registry
from ..envs.tasks import Task
from ..errors import UserError
from ..eval.evaluate import evaluate
from ..rollout.engine import ModelPolicy, RolloutEngine, model_policy
from ..rollout.trajectory import Trajectory
from .learner import Learner


def maybe_lora(model: Any, model_config: Any, run_dir: Path, tokenizer: Any) -> Any:
    """Wrap `model` in a LoRA adapter when `model_config.lora_rank` > 0.

    The base is saved to `run_dir/lora_base` first (as the RL trainer does): it is the
    reference policy of DPO (adapter off) and what the saved adapter applies to.
    """
    if not model_config.lora_rank:
        return model
    model.save_pretrained(run_dir / "lora_base")
    tokenizer.save_pretrained(run_dir / "lora_base")
    return apply_lora(model, model_config.lora_rank, model_config.lora_alpha, model_config.lora_dropout,
                      model_config.lora_targets)


def evaluate_model(model: Any, tokenizer: Any, env: EnvConfig, eval_config: EvalConfig, rollout: RolloutConfig,
                   seed: int) -> dict[str, Any]:
    """Success of the model on the first `eval_config.episodes` items of `env.eval_split`,
    exactly as `agentgym-rl eval` measures it (same engine, same metrics)."""
    policy = model_policy(model, tokenizer, eval_config.temperature, rollout.reuse_kv_cache)
    summary, _ = evaluate(env.id, policy, env.eval_split, eval_config.episodes, eval_config.samples, eval_config.max_turns,
                          eval_config.temperature, seed, rollout, env_kwargs=env.kwargs)
    return summary


def eval_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The `val/*` metrics of an evaluation summary (the RL trainer's names)."""
    return {"val/success": summary["success"], "val/reward": summary["avg_reward"],
            "val/turns": summary["avg_turns"], "val/invalid_action_rate": summary["invalid_action_rate"],
            **{f"val/success/{c}": v for c, v in summary["by_category"].items()}}


def sample_items(tasks: list[Task], count: int, seed: int, tag: str) -> list[Task]:
    """`count` distinct tasks drawn at random: a pure function of (seed, tag)."""
    if count > len(tasks):
        raise UserError(f"asked for {count} items but the split has {len(tasks)}")
    return random.Random(f"{seed}-{tag}").sample(tasks, count)


def save_checkpoint(learner: Learner, tokenizer: Any, folder: Path) -> Path:
    """Write the learner's checkpoint (`model/` is an HF folder `agentgym-rl eval` loads);
    returns the model folder."""
    learner.save(folder)
    tokenizer.save_pretrained(folder / "model")
    return folder / "model"


def sample_episodes(env: EnvConfig, rollout: RolloutConfig, policy: ModelPolicy, tasks: list[Task], samples: int,
                    max_turns: int | None, seed: int, desc: str) -> list[Trajectory]:
    """`samples` episodes of `policy` on each task, with a progress bar.

    Args:
        env: the `EnvConfig` (id and kwargs).
        max_turns: the horizon (None: the environment's turn limit).
    Returns:
        trajectories task by task (token ids exactly as sampled, loss_mask on generated ids).
    """
    from tqdm import tqdm

    engine = RolloutEngine(registry.env_factory(env.id, env.kwargs), rollout)
    horizon = max_turns or registry.spec(env.id).max_turns
    with tqdm(total=len(tasks) * samples, desc=desc, unit="ep") as bar:
        return engine.run(tasks, policy, horizon, samples=samples, seed=seed, progress=bar.update)
