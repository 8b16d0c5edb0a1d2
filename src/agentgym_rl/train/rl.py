"""The online RL trainer: rollout → advantage → PPO-clip update → log, with the
ScalingInter-RL horizon schedule, validation, checkpoints and resume."""

from __future__ import annotations

import copy
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from ..agent.chat import ChatEncoder
from ..agent.generator import HFGenerator
from ..algos import ADVANTAGE, HorizonSchedule, kl_loss, ppo_clip_loss
from ..algos.masked import AGGREGATIONS
from ..config import TrainConfig
from ..envs import registry
from ..errors import UserError
from ..eval.metrics import summarize
from ..rollout.engine import ModelPolicy, RolloutEngine
from ..rollout.trajectory import Trajectory, save_trajectories
from .batch import TokenBatch, collate
from .learner import Learner
from .run_log import MetricsLogger
from .setup import prepare_policy


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    return checkpoints[-1] if checkpoints else None


class RLTrainer:
    """Trains a policy on one environment with a registered advantage estimator.

    Args:
        config: the whole run's config.
        log: where progress lines go (print by default).
    """

    def __init__(self, config: TrainConfig, log: Callable[[str], Any] = print):
        self.config = config
        self.log = log
        registry.spec(config.env.id)
        if config.algo.name not in ADVANTAGE:
            raise UserError(f"unknown algorithm {config.algo.name!r}; available: {', '.join(sorted(ADVANTAGE))}")
        if config.algo.aggregation not in AGGREGATIONS:
            raise UserError(f"unknown aggregation {config.algo.aggregation!r}; choose one of {', '.join(AGGREGATIONS)}")
        try:
            self.schedule = HorizonSchedule(config.schedule.kind, tuple(config.schedule.horizons), config.schedule.every)
        except ValueError as error:
            raise UserError(f"bad schedule: {error}") from None
        if config.model.path is not None and not Path(config.model.path, "config.json").is_file():
            raise UserError(f"model path {config.model.path!r} is not a directory with a config.json")
        self.run_dir = config.run_dir
        self.train_tasks = registry.tasks(config.env.id, config.env.train_split)
        self.val_tasks = registry.tasks(config.env.id, config.env.eval_split)[: config.train.validation_episodes]
        self.engine = RolloutEngine(registry.env_factory(config.env.id, config.env.kwargs), config.rollout)

    # ----------------------------------------------------------------------------- setup
    def _setup(self, resume: bool) -> int:
        cfg = self.config
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            self.log(f"no checkpoint in {self.run_dir}; starting from scratch")
        if checkpoint is None:
            if (self.run_dir / "metrics.jsonl").exists():
                raise UserError(f"run folder {str(self.run_dir)!r} already holds a run; use --resume or a new run_name")
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
            torch.manual_seed(cfg.seed)
            model, tokenizer = prepare_policy(cfg.model.path, cfg.model.tiny, cfg.env.id, cfg.env.kwargs,
                                              cfg.model.corpus_episodes, cfg.warmup, cfg.rollout, self.run_dir,
                                              cfg.seed, self.log)
            start = 0
        else:
            from ..agent.loading import load_model_and_tokenizer

            model, tokenizer = load_model_and_tokenizer(checkpoint / "model")
        self.tokenizer = tokenizer
        self.encoder = ChatEncoder(tokenizer)
        self.learner = Learner(model, cfg.optim)
        self.reference = None
        if cfg.algo.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if checkpoint is not None:
            self.learner.load_optimizer(checkpoint)
            state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
            start = state["step"]
            torch.set_rng_state(state["torch_rng"])
            if self.reference is not None and "reference" in state:
                self.reference.load_state_dict(state["reference"])
            self.log(f"resumed from {checkpoint} at step {start}")
        stop = [self.encoder.end_of_turn_id]
        self.policy = ModelPolicy(HFGenerator(model, tokenizer.pad_token_id, stop, cfg.algo.temperature), self.encoder)
        self.val_policy = ModelPolicy(HFGenerator(model, tokenizer.pad_token_id, stop,
                                                  cfg.train.validation_temperature), self.encoder)
        self.metrics = MetricsLogger(self.run_dir)
        self.metrics.truncate_after(start)
        return start

    # ------------------------------------------------------------------------- main loop
    def fit(self, resume: bool = False) -> list[dict[str, Any]]:
        """Run until `train.steps`; returns the validation summaries logged."""
        from tqdm import tqdm

        cfg = self.config
        start = self._setup(resume)
        validations = []
        if start == 0 and cfg.train.validate_every:
            validations.append(self.validate(0))
        bar = tqdm(range(start, cfg.train.steps), desc="RL", unit="step", initial=start, total=cfg.train.steps)
        for step in bar:
            horizon = self.schedule.horizon(step)
            began = time.time()
            trajectories = self.engine.run(self.sample_tasks(step), self.policy, horizon,
                                           samples=cfg.algo.group_size, seed=cfg.seed)
            rolled = time.time()
            update_metrics = self.update(trajectories, step)
            stats = summarize(trajectories)
            self.metrics.log(step + 1, {
                "horizon": horizon, "train/success": stats["success"], "train/reward": stats["avg_reward"],
                "train/turns": stats["avg_turns"], "train/invalid_action_rate": stats["invalid_action_rate"],
                "train/errors": stats["errors"], **update_metrics,
                "time/rollout_s": rolled - began, "time/update_s": time.time() - rolled,
            })
            bar.set_postfix(success=f"{stats['success']:.2f}", horizon=horizon)
            if cfg.train.save_trajectories:
                save_trajectories(trajectories, self.run_dir / "trajectories" / f"step_{step + 1:06d}.jsonl")
            if cfg.train.validate_every and (step + 1) % cfg.train.validate_every == 0:
                validations.append(self.validate(step + 1))
            if (step + 1) % cfg.train.save_every == 0 or step + 1 == cfg.train.steps:
                self.save(step + 1)
        self.metrics.close()
        return validations

    def sample_tasks(self, step: int) -> list:
        """The tasks of a step: a pure function of (seed, step), so resume replays them."""
        rng = random.Random(f"{self.config.seed}-{step}")
        return rng.sample(self.train_tasks, self.config.algo.tasks_per_step)

    # ---------------------------------------------------------------------------- update
    def update(self, trajectories: list[Trajectory], step: int) -> dict[str, float]:
        """Advantages, then `epochs` passes of PPO-clip over shuffled minibatches."""
        algo = self.config.algo
        rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float)
        groups = torch.tensor([t.group for t in trajectories], dtype=torch.long)
        advantages, adv_metrics = ADVANTAGE[algo.name](rewards, groups, normalize_std=algo.normalize_std)
        # A trajectory with zero advantage adds nothing to the policy gradient; without a KL
        # term it only costs compute, so it is skipped (as DAPO's dynamic sampling does).
        keep = [i for i, t in enumerate(trajectories)
                if sum(t.loss_mask) > 0 and (algo.kl_coef > 0 or advantages[i].abs() > 0)]
        metrics = {f"adv/{k}": float(v) for k, v in adv_metrics.items()}
        metrics["update/trajectories"] = len(keep)
        if not keep:
            return metrics
        batch = collate([trajectories[i] for i in keep], self.tokenizer.pad_token_id)
        batch["advantages"] = advantages[keep]
        if self.reference is not None:
            batch["ref_logprobs"] = self.learner.logprobs(batch, model=self.reference)
        rng = torch.Generator().manual_seed(self.config.seed * 100_003 + step)
        summed: dict[str, float] = {}
        updates = 0
        for _ in range(algo.epochs):
            order = torch.randperm(len(keep), generator=rng)
            for start in range(0, len(keep), algo.minibatch_size):
                minibatch = {k: v[order[start:start + algo.minibatch_size]] for k, v in batch.items()}
                result = self.learner.update(minibatch, self._loss,
                                             "tokens" if algo.aggregation == "token-mean" else "sequences")
                for key, value in result.items():
                    summed[key] = summed.get(key, 0.0) + value
                updates += 1
        metrics.update({f"update/{k}": v / updates for k, v in summed.items()})
        return metrics

    def _loss(self, batch: TokenBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        algo = self.config.algo
        mask = batch["loss_mask"]
        token_advantages = batch["advantages"][:, None] * mask
        loss, metrics = ppo_clip_loss(logprobs, batch["old_logprobs"], token_advantages, mask,
                                      clip_eps=algo.clip_eps, aggregation=algo.aggregation)
        if self.reference is not None:
            kl = kl_loss(logprobs, batch["ref_logprobs"], mask, kind=algo.kl_estimator)
            loss = loss + algo.kl_coef * kl
            metrics = {**metrics, "kl": float(kl)}
        return loss, metrics

    # ------------------------------------------------------------------ validate and save
    def validate(self, step: int) -> dict[str, Any]:
        """Success on held-out items at the evaluation horizon; logged as val/*."""
        from tqdm import tqdm

        horizon = self.config.train.validation_max_turns or registry.spec(self.config.env.id).max_turns
        with tqdm(total=len(self.val_tasks), desc=f"validation (step {step})", unit="ep", leave=False) as bar:
            trajectories = self.engine.run(self.val_tasks, self.val_policy, horizon, seed=self.config.seed,
                                           progress=bar.update)
        stats = summarize(trajectories)
        self.metrics.log(step, {"val/success": stats["success"], "val/reward": stats["avg_reward"],
                                **{f"val/success/{c}": v for c, v in stats["by_category"].items()}})
        self.log(f"step {step}: validation success {stats['success']:.3f} on {stats['episodes']} items")
        return {"step": step, **stats, "item_success": {t.item_id: t.success for t in trajectories}}

    def save(self, step: int) -> None:
        folder = self.run_dir / "checkpoints" / f"step_{step:06d}"
        self.learner.save(folder)
        self.tokenizer.save_pretrained(folder / "model")
        state = {"step": step, "torch_rng": torch.get_rng_state()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        torch.save(state, folder / "trainer_state.pt")
