"""The online RL trainer: rollout → advantage → PPO-clip update → log, with the
ScalingInter-RL horizon schedule, validation, checkpoints and resume.

One trainer serves every algorithm of `agentgym_rl.algos.ALGORITHMS`: the recipe names the
advantage estimator, where the KL goes, whether a value head is trained, the ratio level.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..agent.lora import load_lora
from ..algos import (KL, HorizonSchedule, compute_advantages, discredit_turns, entropy_loss,
                     kl_loss, make_kl_controller, outcome_token_rewards, penalize_tokens,
                     ppo_clip_loss, right_token_loss, value_clip_loss)
from ..config import RLConfig
from ..envs import registry
from ..errors import UserError
from ..eval.metrics import summarize
from ..rollout.engine import RolloutEngine, model_policy
from ..rollout.trajectory import Trajectory, save_trajectories
from ..runs import MetricsLogger, latest_checkpoint, start_run
from .batch import TokenBatch, collate, right_token_positions
from .common import maybe_lora
from .learner import Learner
from .setup import prepare_policy


class RLTrainer:
    """Trains a policy on one environment with a registered advantage estimator.

    Args:
        config: the whole run's config.
        log: where progress lines go (print by default).
    """

    def __init__(self, config: RLConfig, log: Callable[[str], Any] = print):
        self.config = config
        self.log = log
        registry.spec(config.env.id)
        self.algorithm = config.algo.spec()
        try:
            adaptive = config.algo.kl_control == "adaptive"
            self.kl_control = make_kl_controller(config.algo.kl_control, self.algorithm.kl_coef,
                                                 target=config.algo.kl_target if adaptive else None,
                                                 horizon=config.algo.kl_horizon if adaptive else None)
        except ValueError as error:
            raise UserError(f"algo: {error}") from None
        self.schedule = HorizonSchedule(config.schedule.kind, tuple(config.schedule.horizons), config.schedule.every)
        if config.model.path is not None and not Path(config.model.path, "config.json").is_file():
            raise UserError(f"model path {config.model.path!r} is not a directory with a config.json")
        self.run_dir = config.run.dir
        self.train_tasks = registry.tasks(config.env.id, config.env.train_split)
        self.val_tasks = registry.tasks(config.env.id, config.env.eval_split)[: config.eval.episodes]
        make_env = registry.env_factory(config.env.id, config.env.kwargs)
        # The penalty and the right-token loss need to know where rejected replies went wrong.
        locate = (config.rollout.locate_wrong_tokens or config.algo.invalid_turn_penalty is not None
                  or config.algo.right_token_coef > 0)
        self.engine = RolloutEngine(registry.with_invalid_action_penalty(make_env, config.env.invalid_action_penalty),
                                    dataclasses.replace(config.rollout, locate_wrong_tokens=locate))
        self.val_engine = RolloutEngine(make_env, config.rollout)

    # ----------------------------------------------------------------------------- setup
    def _setup(self, resume: bool) -> int:
        cfg = self.config
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            self.log(f"no checkpoint in {self.run_dir}; starting from scratch")
        if checkpoint is None:
            start_run(self.run_dir, cfg, hint="use --resume or a new run.name")
            torch.manual_seed(cfg.run.seed)
            model, tokenizer = prepare_policy(cfg.model, cfg.env, cfg.warmup, cfg.rollout, self.run_dir, cfg.run.seed,
                                              self.log)
            # With LoRA the warmed-up model is the adapter's base (and KL reference); resume needs it.
            model = maybe_lora(model, cfg.model, self.run_dir, tokenizer)
            start = 0
        else:
            from ..agent.loading import load_model_and_tokenizer

            if cfg.model.lora_rank:
                base, tokenizer = load_model_and_tokenizer(self.run_dir / "lora_base")
                model = load_lora(base, checkpoint / "adapter")
            else:
                model, tokenizer = load_model_and_tokenizer(checkpoint / "model")
        self.tokenizer = tokenizer
        self.learner = Learner(model, cfg.optim, value_head=self.algorithm.needs_critic,
                               entropy=cfg.algo.entropy_coef > 0, temperature=cfg.algo.temperature)
        # The KL reference: the adapter-disabled base with LoRA (no copy), else a frozen copy.
        self.reference = None
        if self.algorithm.kl_coef > 0 and not cfg.model.lora_rank:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if checkpoint is not None:
            self.learner.load_state(checkpoint)
            state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
            start = state["step"]
            torch.set_rng_state(state["torch_rng"])
            self.kl_control.load_state_dict(state["kl_control"])
            if self.reference is not None and "reference" in state:
                self.reference.load_state_dict(state["reference"])
            self.log(f"resumed from {checkpoint} at step {start}")
        self.policy = model_policy(model, tokenizer, cfg.algo.temperature, cfg.rollout.reuse_kv_cache)
        self.val_policy = model_policy(model, tokenizer, cfg.eval.temperature,
                                       cfg.rollout.reuse_kv_cache)
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
        if start == 0 and cfg.train.validate_every and cfg.eval.episodes:
            validations.append(self.validate(0))
        bar = tqdm(range(start, cfg.train.steps), desc="RL", unit="step", initial=start, total=cfg.train.steps)
        for step in bar:
            horizon = self.schedule.horizon(step)
            began = time.time()
            trajectories = self.engine.run(self.sample_tasks(step), self.policy, horizon,
                                           samples=cfg.algo.group_size, seed=cfg.run.seed)
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
            if cfg.train.validate_every and cfg.eval.episodes and (step + 1) % cfg.train.validate_every == 0:
                validations.append(self.validate(step + 1))
            if (step + 1) % cfg.train.save_every == 0 or step + 1 == cfg.train.steps:
                self.save(step + 1)
        self.metrics.close()
        return validations

    def sample_tasks(self, step: int) -> list:
        """The tasks of a step: a pure function of (seed, step), so resume replays them."""
        rng = random.Random(f"{self.config.run.seed}-{step}")
        return rng.sample(self.train_tasks, self.config.algo.tasks_per_step)

    # ---------------------------------------------------------------------------- update
    def update(self, trajectories: list[Trajectory], step: int) -> dict[str, float]:
        """Advantages by the algorithm's estimator, then `epochs` passes of the PPO-clip loss
        (plus value, KL and entropy terms as configured) over shuffled minibatches."""
        spec, algo = self.algorithm, self.config.algo
        rows = [t for t in trajectories if sum(t.loss_mask) > 0]
        metrics: dict[str, float] = {"kl_coef": self.kl_control.value, "update/trajectories": 0}
        if not rows:
            return metrics
        batch = collate(rows, self.tokenizer.pad_token_id, right_tokens=algo.right_token_coef > 0)
        mask = batch["loss_mask"]
        beta = self.kl_control.value
        # Values and a KL in the reward enter the advantages: score every row first. Otherwise
        # only the rows kept for the update are scored (below), which saves a forward pass
        # over the rows of groups without signal.
        score_first = spec.needs_critic or spec.kl_in_reward
        if score_first:
            self._score(batch, beta)
        rewards = torch.tensor([t.reward for t in rows], dtype=torch.float)
        fields = {"rewards": rewards, "group_ids": torch.tensor([t.group for t in rows]), "mask": mask,
                  "token_rewards": outcome_token_rewards(rewards, mask), "values": batch.get("old_values")}
        hparams = spec.advantage_kwargs()
        if spec.kl_in_reward:
            hparams["kl_coef"] = beta
            fields["kl"] = KL[spec.kl_estimator](batch["old_logprobs"], batch["ref_logprobs"]) * mask \
                if beta > 0 else torch.zeros_like(mask)
        out = compute_advantages(spec.advantage, fields, **hparams)
        metrics.update({f"adv/{k}": float(v) for k, v in out.metrics.items()})
        batch["advantages"] = out.token_advantages(mask)
        if algo.invalid_turn_penalty is not None:
            wrong_tokens = [t.wrong_tokens for t in rows]
            batch["advantages"], capped = discredit_turns(batch["advantages"], mask, [t.invalid_turns for t in rows],
                                                          wrong_tokens)
            batch["advantages"] = penalize_tokens(batch["advantages"], wrong_tokens, algo.invalid_turn_penalty)
            metrics["adv/invalid_tokens_capped"] = capped
            metrics["adv/wrong_tokens"] = sum(map(len, wrong_tokens))
        if out.returns is not None:
            batch["returns"] = out.returns
        # A row with zero advantage adds nothing to the policy gradient; without a KL or value
        # term it only costs compute, so it is skipped (as DAPO's dynamic sampling does).
        other_terms = spec.needs_critic or (beta > 0 and not spec.kl_in_reward)
        skip_zero = algo.skip_zero_advantage and not other_terms
        signal = batch["advantages"].abs().sum(1) > 0
        if "right_ids" in batch:  # the right-token loss needs no advantage
            has_right = right_token_positions(batch)
            signal |= has_right.any(1)
            metrics["adv/right_token_positions"] = int(has_right.sum())
        keep = out.keep & signal if skip_zero else out.keep
        keep = keep.nonzero().squeeze(1)
        metrics["update/trajectories"] = len(keep)
        if len(keep) == 0:
            return metrics
        batch = {k: v[keep] for k, v in batch.items()}
        if not score_first:
            self._score(batch, beta)
        rng = torch.Generator().manual_seed(self.config.run.seed * 100_003 + step)
        weight_by = "tokens" if spec.aggregation == "token-mean" else "sequences"
        skip = ("approx_kl", algo.max_kl) if algo.max_kl > 0 else None
        summed: dict[str, float] = {}
        updates = 0
        for _ in range(spec.epochs):
            order = torch.randperm(len(keep), generator=rng)
            for start in range(0, len(keep), algo.minibatch_size):
                minibatch = {k: v[order[start:start + algo.minibatch_size]] for k, v in batch.items()}
                result = self.learner.update(minibatch, self._loss, weight_by, skip_above=skip)
                for key, value in result.items():
                    summed[key] = summed.get(key, 0.0) + value
                updates += 1
        metrics.update({f"update/{k}": v / updates for k, v in summed.items() if k != "skipped"})
        metrics["update/skipped_steps"] = summed.get("skipped", 0.0)
        if beta > 0 and "kl" in summed:
            self.kl_control.update(summed["kl"] / updates, n_steps=len(rows))
        return metrics

    def _score(self, batch: TokenBatch, beta: float) -> None:
        """Add the rows' old logprobs (recomputed by the learner), old values (with a critic)
        and reference logprobs (with a KL term) to `batch`, in place."""
        if self.config.algo.recompute_old_logprobs or self.algorithm.needs_critic:
            scored = self.learner.outputs(batch)
            if self.config.algo.recompute_old_logprobs:
                batch["old_logprobs"] = scored["logprobs"] * batch["loss_mask"]
            if self.algorithm.needs_critic:
                batch["old_values"] = scored["values"]
        if beta > 0:
            batch["ref_logprobs"] = self._reference_logprobs(batch)

    def _reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        if self.reference is None:
            return self.learner.logprobs(batch, reference=True)
        return self.learner.logprobs(batch, model=self.reference)

    def _loss(self, batch: TokenBatch, outputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        spec, algo = self.algorithm, self.config.algo
        mask, logprobs = batch["loss_mask"], outputs["logprobs"]
        loss, metrics = ppo_clip_loss(logprobs, batch["old_logprobs"], batch["advantages"], mask,
                                      clip_eps=spec.clip_eps, aggregation=spec.aggregation,
                                      ratio_level=spec.ratio_level)
        if spec.needs_critic:
            value_loss, value_metrics = value_clip_loss(outputs["values"], batch["old_values"], batch["returns"],
                                                        mask, clip_eps=spec.value_clip_eps,
                                                        aggregation=spec.aggregation)
            loss = loss + algo.value_coef * value_loss
            metrics = {**metrics, **value_metrics, "value_loss": value_loss.item()}
        if "ref_logprobs" in batch:
            kl = kl_loss(logprobs, batch["ref_logprobs"], mask, kind=spec.kl_estimator)
            if not spec.kl_in_reward:
                loss = loss + self.kl_control.value * kl
            metrics = {**metrics, "kl": kl.item()}
        if "right_ids" in batch:
            right_loss, right_metrics = right_token_loss(outputs["right_logprobs"], right_token_positions(batch))
            loss = loss + algo.right_token_coef * right_loss
            metrics = {**metrics, **right_metrics, "right_token_loss": right_loss.item()}
        if algo.entropy_coef > 0:
            bonus, entropy_metrics = entropy_loss(mask, entropy=outputs["entropy"], aggregation=spec.aggregation)
            loss = loss + algo.entropy_coef * bonus
            metrics = {**metrics, **entropy_metrics}
        return loss, metrics

    # ------------------------------------------------------------------ validate and save
    def validate(self, step: int) -> dict[str, Any]:
        """Success on held-out items at the evaluation horizon; logged as val/*."""
        from tqdm import tqdm

        evaluation = self.config.eval
        horizon = evaluation.max_turns or registry.spec(self.config.env.id).max_turns
        episodes = len(self.val_tasks) * evaluation.samples
        with tqdm(total=episodes, desc=f"validation (step {step})", unit="ep", leave=False) as bar:
            trajectories = self.val_engine.run(self.val_tasks, self.val_policy, horizon, samples=evaluation.samples,
                                               seed=self.config.run.seed, progress=bar.update)
        stats = summarize(trajectories)
        if self.config.train.save_trajectories:  # per-item results, for paired comparisons of runs
            save_trajectories(trajectories, self.run_dir / "validation" / f"step_{step:06d}.jsonl")
        self.metrics.log(step, {"val/success": stats["success"], "val/reward": stats["avg_reward"],
                                **{f"val/success/{c}": v for c, v in stats["by_category"].items()}})
        self.log(f"step {step}: validation success {stats['success']:.3f} on {stats['episodes']} items")
        per_item: dict[str, list[bool]] = {}
        for t in trajectories:
            per_item.setdefault(t.item_id, []).append(t.success)
        return {"step": step, **stats, "item_success": {item: sum(s) / len(s) for item, s in per_item.items()}}

    def save(self, step: int) -> None:
        folder = self.run_dir / "checkpoints" / f"step_{step:06d}"
        self.learner.save(folder)
        self.tokenizer.save_pretrained(folder / "model")
        state = {"step": step, "torch_rng": torch.get_rng_state(), "kl_control": self.kl_control.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        torch.save(state, folder / "trainer_state.pt")
