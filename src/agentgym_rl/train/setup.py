"""Building the policy a run starts from: a local model, or the tiny model warmed up on
expert demonstrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..agent.chat import ChatEncoder
from ..agent.loading import load_model_and_tokenizer
from ..agent.tiny import build_tiny
from ..envs import registry
from ..rollout.engine import RolloutConfig, RolloutEngine
from ..rollout.trajectory import Trajectory
from .learner import Learner, OptimConfig
from .sft import encode_demonstrations, sft_epochs


def collect_expert(env_id: str, split: str, episodes: int, seed: int = 0, max_turns: int | None = None,
                   rollout: RolloutConfig | None = None, env_kwargs: dict | None = None,
                   progress: Any = None) -> list[Trajectory]:
    """Run the environment's expert on the first `episodes` tasks of `split`."""
    tasks = registry.tasks(env_id, split)[:episodes]
    engine = RolloutEngine(registry.env_factory(env_id, env_kwargs), rollout or RolloutConfig())
    expert = registry.make_expert(env_id)
    horizon = max_turns or registry.spec(env_id).max_turns
    return engine.run(tasks, expert, horizon, seed=seed, progress=progress)


def conversation_text(trajectories: list[Trajectory]) -> list[str]:
    """Every message text, for training a tokenizer."""
    return [m["content"] for t in trajectories for m in t.messages]


def prepare_policy(model_path: str | None, tiny_config: Any, env_id: str, env_kwargs: dict, corpus_episodes: int,
                   warmup: Any, rollout: RolloutConfig, out_dir: Path, seed: int,
                   log: Any = print) -> tuple[Any, Any]:
    """Load `model_path`, or build the tiny model, then optionally warm it up with SFT.

    The tiny model's tokenizer is trained on the text of expert episodes on training items;
    the same episodes (successful ones) are the warm-up demonstrations. They are played
    with `rollout`'s prompt options so demonstrations look like the RL conversations.

    Returns:
        (model, tokenizer); the tiny model and tokenizer are saved under `out_dir/base_model`.
    """
    need = max(corpus_episodes if model_path is None else 0, warmup.episodes)
    demos: list[Trajectory] = []
    if need:
        with tqdm(total=need, desc="expert demonstrations", unit="ep") as bar:
            demos = collect_expert(env_id, "train", need, seed=seed, rollout=rollout, env_kwargs=env_kwargs,
                                   progress=bar.update)
    if model_path is None:
        base = build_tiny(conversation_text(demos[:corpus_episodes]), out_dir / "base_model", tiny_config, seed)
        model, tokenizer = load_model_and_tokenizer(base)
        log(f"built the tiny model: {sum(p.numel() for p in model.parameters()):,} parameters, "
            f"vocabulary {len(tokenizer)}")
    else:
        model, tokenizer = load_model_and_tokenizer(model_path)
    if warmup.episodes:
        successes = [t for t in demos[:warmup.episodes] if t.success]
        data = [t for t in encode_demonstrations(ChatEncoder(tokenizer), successes)
                if len(t.input_ids) <= warmup.max_tokens]
        learner = Learner(model, OptimConfig(lr=warmup.lr, micro_batch_size=warmup.batch_size))
        batches = warmup.epochs * -(-len(data) // warmup.batch_size)
        with tqdm(total=batches, desc="warm-up SFT", unit="batch") as bar:
            losses = sft_epochs(learner, data, tokenizer.pad_token_id, warmup.epochs, warmup.batch_size, seed,
                                progress=bar.update)
        log(f"warm-up: {len(data)} expert demonstrations, {warmup.epochs} epochs, "
            f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return model, tokenizer
