"""The one assembly point of a run: every trainer starts its run here.

A `Session` puts a run together from its config: the run folder (started, or resumed from a
checkpoint), the seed, the device and dtype, the model (a local folder or the tiny model, warmed
up on expert demonstrations, wrapped in LoRA), the learner, the metrics log, and the model's
policies, sampling and evaluation. Trainers keep only what is their own: the data, the loss
and the loop.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from ..progress import progress_bar

from ..agent.allocator import mmap_threshold_kb, set_mmap_threshold
from ..agent.loading import describe_device, load_model_and_tokenizer, model_damage, resolve_device
from ..agent.models import NAMED_MODELS, is_model_reference, looks_like_hub_id, model_folder
from ..agent.lora import apply_lora, load_lora
from ..agent.tiny import build_tiny
from ..config import EvalConfig
from .. import trackers
from ..envs import registry
from ..envs.tasks import Task
from ..errors import UserError
from ..eval.evaluate import evaluate
from ..eval.metrics import Summary
from ..rollout.engine import RolloutEngine
from ..rollout.rewards import EpisodeReward
from ..rollout.backends import backend_of, check_backend, model_policy
from ..rollout.policy import ModelPolicy
from ..rollout.trajectory import Trajectory
from ..runs import MetricsLogger, NoMetrics, checkpoint_step, run_lock, start_run
from .demonstrations import collect_expert, conversation_text, warm_up
from .learner import Learner
from .. import metric_names as metric


def check_model_path(model_path: str | None) -> None:
    """Fail early (before collecting data) on a `model.path` that is not a model folder, a named
    model, a `.gguf` file or a Hub id in the local Hugging Face cache."""
    if model_path is not None and looks_like_hub_id(model_path):
        model_folder(model_path)  # says how to get it into the cache when it is not there
    if model_path is not None and not is_model_reference(model_path) and not Path(model_path, "config.json").is_file():
        raise UserError(f"model path {model_path!r} is not a directory with a config.json; set model.path to a "
                        f"Hugging Face model folder (e.g. a run's checkpoints/.../model), a named model "
                        f"({', '.join(sorted(NAMED_MODELS))}), a .gguf file, or null for the tiny model")
    if model_path is not None and not is_model_reference(model_path):
        damage = model_damage(Path(model_path))
        if damage is not None:
            raise UserError(f"model path {model_path!r} does not load: {damage}")


def check_installed(config: Any) -> None:
    """A `UserError` naming what to install for each optional dependency `config` asks for (its
    loggers, vLLM, Ray, the environment's browser or Java): before any work, and before the run
    folder is written, rather than once the model is built."""
    import importlib.util

    trackers.check_installed(config.run.loggers)
    check_backend(config.rollout, config.run.device)
    ray_envs = any(url.startswith(registry.RAY_SCHEME) for url in config.env.urls)
    if (ray_envs or config.rollout.workers) and importlib.util.find_spec("ray") is None:
        what = "env.urls names Ray" if ray_envs else "rollout.workers run on Ray"
        raise UserError(f"{what}, which is not installed: pip install 'agentgym-rl[ray]'")
    if not config.env.urls:  # an env server has what its environment needs, not this machine
        registry.check_installed(config.env.id, config.env.kwargs)


def holds_run_folder(fit: Callable[..., Any]) -> Callable[..., Any]:
    """A trainer's `fit`, run while its process holds the run folder's lock (`runs.run_lock`), so
    that no other command deletes or writes the run meanwhile; a `torchrun` rank > 0 takes
    none (rank 0 holds it for the run)."""

    @functools.wraps(fit)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "rank", 0) > 0:
            return fit(self, *args, **kwargs)
        with run_lock(self.run_dir, self.log):
            return fit(self, *args, **kwargs)

    return locked


class Trainer:
    """What every trainer starts with: its config, checked as far as it can be before any work
    (the environment and its splits, the model folder), and where progress lines go.

    Args:
        config: the run's whole config.
        log: where progress lines go (print by default).
    """

    def __init__(self, config: Any, log: Callable[[str], Any] = print):
        registry.spec(config.env.id)
        check_installed(config)
        registry.tasks(config.env.id, config.env.train_split, config.env.kwargs)
        if config.eval.episodes:
            registry.tasks(config.env.id, config.env.eval_split, config.env.kwargs)
        check_model_path(config.model.path)
        warmup = getattr(config, "warmup", None)
        if warmup is not None and warmup.augment:
            registry.augmenter(config.env.id)  # the environment makes renamed copies of its episodes
        backend = backend_of(config.rollout)
        if not backend.trains:
            raise UserError(f"{backend.about} samples with weights the learner cannot update: use it with eval or "
                            "collect, not for training")
        if config.model.lora_rank and not backend.lora:
            raise UserError(f"rollout.generator: {backend.name} does not take LoRA adapters yet: use hf, or no LoRA "
                            "(model.lora_rank: 0)")
        self.config, self.log, self.run_dir = config, log, config.run.dir


def sample_items(tasks: list[Task], count: int, seed: int, tag: str) -> list[Task]:
    """`count` distinct tasks drawn at random: a pure function of (seed, tag)."""
    if count > len(tasks):
        raise UserError(f"asked for {count} items but the split has {len(tasks)}")
    return random.Random(f"{seed}-{tag}").sample(tasks, count)


def eval_metrics(summary: Summary) -> dict[str, float]:
    """The `val/*` metrics of an evaluation summary (the RL trainer's names)."""
    return {metric.VAL_SUCCESS: summary.success, metric.VAL_REWARD: summary.avg_reward,
            metric.VAL_TURNS: summary.avg_turns, metric.VAL_INVALID_ACTION_RATE: summary.invalid_action_rate,
            **{metric.category_success("val", c): v for c, v in summary.by_category.items()}}


def training_threshold_kb(config: Any) -> int:
    """The mmap threshold a training process of `config` sets: "auto" by whether it updates every
    weight (no LoRA adapter) or an adapter's only."""
    return mmap_threshold_kb(config.run.malloc_mmap_threshold_kb, full_fine_tuning=not config.model.lora_rank)


@dataclass
class Session:
    """A run put together: its folder, model, tokenizer, learner and metrics log.

    Attributes:
        config: the run's whole config (any of `RLConfig`, `SFTConfig`, `DPOConfig`, `RFTConfig`:
            they share the run, env, model, rollout and optim sections).
        learner: owns the trainable model (`learner.model`, also `model`) and the optimizer.
    """

    config: Any
    run_dir: Path
    model: Any
    tokenizer: Any
    learner: Learner
    metrics: MetricsLogger | NoMetrics
    device: torch.device
    log: Callable[[str], Any] = print
    generator_engine: Any = None
    """The engine the policies sample through with a backend that has one (`rollout.generator:
    vllm`), started on first use."""
    writes: bool = True
    """Whether this process writes the run folder (False: a `torchrun` rank > 0)."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def start(cls, config: Any, log: Callable[[str], Any] = print, corpus: Callable[[], list[str]] | None = None,
              already_running: str = "choose a new run.name", **learner_options: Any) -> Session:
        """Start a new run in `config.run.dir`: write its config, seed torch, load `model.path` or
        build the tiny model, warm it up (`config.warmup`, when the config has one), keep that
        model (`lora_base/` under LoRA, which it wraps in, else `warmup_model/` after a warm-up),
        and make its learner.

        Args:
            corpus: the texts the tiny model's tokenizer is trained on; None plays
                `model.corpus_episodes` expert episodes of `env.id` (those also serve the warm-up).
            already_running: what to tell a user whose run folder already holds a run.
            learner_options: passed to `Learner` (value_head, entropy, temperature).
        """
        check_model_path(config.model.path)
        set_mmap_threshold(training_threshold_kb(config))
        device = resolve_device(config.run.device)
        run_dir = config.run.dir
        start_run(run_dir, config, hint=already_running)
        log(describe_device(device, config.run.dtype))
        torch.manual_seed(config.run.seed)
        model, tokenizer, warmed_up = _first_model(config, run_dir, device, corpus, log)
        if config.model.lora_rank:
            # The base is what the saved adapter applies to, and the reference policy (adapter off).
            model.save_pretrained(run_dir / "lora_base")
            tokenizer.save_pretrained(run_dir / "lora_base")
            lora = config.model
            model = apply_lora(model, lora.lora_rank, lora.lora_alpha, lora.lora_dropout, lora.lora_targets)
        elif warmed_up:
            # Kept so that runs can start from the same warm-up (model.path=RUN/warmup_model
            # warmup.episodes=0): the RL-vs-imitation and horizon studies compare arms from it.
            model.save_pretrained(run_dir / "warmup_model")
            tokenizer.save_pretrained(run_dir / "warmup_model")
        return cls(config, run_dir, model, tokenizer, Learner(model, config.optim, **learner_options),
                   MetricsLogger(run_dir, config.run.loggers, config), device, log)

    @classmethod
    def resume(cls, config: Any, checkpoint: Path, log: Callable[[str], Any] = print, writes: bool = True,
               **learner_options: Any) -> Session:
        """Reopen a run at `checkpoint` (a folder of `checkpoints/`): its model (or the LoRA
        adapter over the run's `lora_base`) and, through `learner.load_state`, its optimizer."""
        set_mmap_threshold(training_threshold_kb(config))
        device = resolve_device(config.run.device)
        run_dir = config.run.dir
        if writes:
            log(describe_device(device, config.run.dtype))
        if config.model.lora_rank:
            base, tokenizer = load_model_and_tokenizer(run_dir / "lora_base", config.run.dtype)
            model = load_lora(base.to(device), checkpoint / "adapter")
        else:
            model, tokenizer = load_model_and_tokenizer(checkpoint / "model", config.run.dtype)
            model = model.to(device)
        learner = Learner(model, config.optim, **learner_options)
        learner.load_state(checkpoint)
        metrics = (MetricsLogger(run_dir, config.run.loggers, config, resumed_at=checkpoint_step(checkpoint))
                   if writes else NoMetrics())  # writes=False: a torchrun rank > 0
        return cls(config, run_dir, model, tokenizer, learner, metrics, device, log, writes=writes)

    # ------------------------------------------------------------- using the model
    def policy(self, temperature: float, listed_actions_only: bool = False, model: Any = None) -> ModelPolicy:
        """The model as a rollout policy sampling at `temperature` (0: greedy), through
        `rollout.generator`; the trainer syncs the generator's weights after every update.
        `listed_actions_only`: for evaluation (see `ModelPolicy`). `model`: the module to sample
        from (default: the learner's `rollout_model`)."""
        backend = backend_of(self.config.rollout)
        engine = self._generator_engine(backend.engine) if backend.engine is not None else None
        return model_policy(self.learner.rollout_model if model is None else model, self.tokenizer, temperature,
                            self.config.rollout, listed_actions_only, engine=engine)

    def _generator_engine(self, start: Callable[..., Any]) -> Any:
        """The session's generator engine (vLLM's), started once on the model's current weights by
        its backend's `engine` (`rollout.backends.GeneratorBackend`)."""
        if self.generator_engine is None:
            folder = self.run_dir / "engine_model"  # engines start from a model folder
            self.learner.rollout_model.save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
            config = self.config
            self.generator_engine = start(folder, config.run.dtype, config.rollout, config.run.seed)
        return self.generator_engine

    def sample(self, tasks: list[Task], samples: int, temperature: float, max_turns: int | None,
               desc: str) -> list[Trajectory]:
        """`samples` episodes of the model on each of `tasks` (horizon `max_turns`, None: the
        environment's), with a progress bar; token ids exactly as sampled. Training data (DPO's
        pairs, RFT's rounds): rewards carry `env.invalid_action_penalty`, as RL's rollouts do."""
        env = self.config.env
        make_env = registry.env_factory(env.id, env.kwargs, env.urls, env.server_timeout)
        engine = RolloutEngine(registry.with_invalid_action_penalty(make_env, env.invalid_action_penalty),
                               self.config.rollout, self.reward)
        horizon = max_turns or registry.spec(env.id).max_turns
        with engine, progress_bar(total=len(tasks) * samples, desc=desc, unit="ep") as bar:
            return engine.run(tasks, self.policy(temperature), horizon, samples=samples, seed=self.config.run.seed,
                              progress=bar.update)

    def evaluate(self, evaluation: EvalConfig | None = None) -> Summary:
        """Success of the model on the first `eval.episodes` items of `env.eval_split`, exactly as
        `agentgym-rl eval` measures it (same engine, same metrics); `evaluation` defaults to the
        config's `eval` section."""
        evaluation = evaluation or self.config.eval
        env = self.config.env
        policy = self.policy(evaluation.temperature, evaluation.listed_actions_only)
        played, _ = evaluate(env.id, policy, env.eval_split, evaluation.episodes,
                              evaluation.samples, evaluation.max_turns, evaluation.temperature, self.config.run.seed,
                              self.config.rollout, env_kwargs=env.kwargs, env_urls=env.urls,
                              env_timeout=env.server_timeout, listed_actions_only=evaluation.listed_actions_only,
                              reward=self.reward)
        return played.summary

    @functools.cached_property
    def reward(self) -> EpisodeReward | None:
        """`env.reward` or `env.judge`, built once for the session: a judge keeps its answers
        across the session's evaluations and sampling rounds."""
        return EpisodeReward.from_env(self.config.env)

    def save(self, name: str) -> Path:
        """Write `checkpoints/<name>/` (learner state, and `model/`, an HF folder `eval` loads);
        returns the model folder."""
        folder = self.run_dir / "checkpoints" / name
        self.learner.save(folder)  # sharded: every rank gathers, rank 0 writes
        if self.writes:
            self.tokenizer.save_pretrained(folder / "model")
        return folder / "model"


def _first_model(config: Any, run_dir: Path, device: torch.device, corpus: Callable[[], list[str]] | None,
                 log: Callable[[str], Any]) -> tuple[Any, Any, bool]:
    """The model a new run starts from, on `device` in `run.dtype`: `model.path`, or the tiny
    model built under `run_dir/base_model`; then the warm-up, if the config asks for one
    (the flag returned)."""
    warmup = getattr(config, "warmup", None)
    warmup_episodes = warmup.episodes if warmup is not None else 0
    builds_tiny = config.model.path is None
    need = max(config.model.corpus_episodes if builds_tiny and corpus is None else 0, warmup_episodes)
    demos: list[Trajectory] = []
    if need and warmup is not None and warmup.path:
        demos = _demonstrations_file(warmup.path, config.env.id, log)
    elif need:
        env = config.env
        with progress_bar(total=need, desc="expert demonstrations", unit="ep") as bar:
            demos = collect_expert(env.id, env.train_split, need, seed=config.run.seed, rollout=config.rollout,
                                   env_kwargs=env.kwargs, progress=bar.update, env_urls=env.urls,
                                   env_timeout=env.server_timeout, perturb=warmup.perturb if warmup else 0.0)
    path = config.model.path
    if builds_tiny:
        texts = corpus() if corpus is not None else conversation_text(demos[:config.model.corpus_episodes])
        path = build_tiny(texts, run_dir / "base_model", config.model.tiny, config.run.seed)
    model, tokenizer = load_model_and_tokenizer(path, config.run.dtype)
    model = model.to(device)
    if builds_tiny:
        log(f"built the tiny model: {sum(p.numel() for p in model.parameters()):,} parameters, "
            f"vocabulary {len(tokenizer)}")
    if warmup_episodes and not builds_tiny:
        log(f"warming up the pretrained model {path} on {warmup_episodes} expert episodes first "
            "(warmup.episodes=0 starts RL from the model as it is, as the AgentGym-RL paper does)")
    if warmup_episodes:
        warm_up(model, tokenizer, demos, warmup, config.run.seed, log)
    return model, tokenizer, bool(warmup_episodes)


def _demonstrations_file(path: str, env_id: str, log: Callable[[str], Any]) -> list[Trajectory]:
    """The episodes of `warmup.path`, checked to be of the run's environment."""
    from ..rollout.formats import load_conversations

    demos = load_conversations(path)
    others = sorted({t.env_id for t in demos if t.env_id and t.env_id != env_id})
    if others:
        raise UserError(f"warmup.path {path!r} holds episodes of {', '.join(others)}, not of the run's env {env_id!r}")
    log(f"warm-up demonstrations from {path}: {len(demos)} episodes, {sum(t.success for t in demos)} successful")
    return demos
