"""The rejection-sampling fine-tuning trainer (`agentgym-rl rft`).

Round r = 1..R:

1. sample k = `rft.samples_per_item` episodes on each of `rft.items` training items drawn
   at random (a new draw per round) with the current policy at `rft.temperature`;
2. keep the successful episodes (one copy of identical ones with `rft.dedupe`);
3. fine-tune the current policy on them with the SFT loss (`train.*`), on their token ids
   exactly as sampled (loss on the generated tokens);
4. evaluate on the test split (`eval.*`) and save `checkpoints/round_RRR/`.

This is SFT on the policy's own successes, i.e. the filtered-behaviour-cloning step of
expert iteration / ReST-style training: maximising Σ_{y: success(y)} log π(y).

Run folder: `config.yaml`, `metrics.jsonl` (step = round; step 0 = the starting policy's
evaluation), `trajectories/round_RRR.jsonl` (every sampled episode),
`checkpoints/round_RRR/model/`.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from tqdm import tqdm

from ..config import RFTConfig
from ..envs import registry
from ..rollout.trajectory import Trajectory, save_trajectories
from ..runs import MetricsLogger, start_run
from .common import (eval_metrics, evaluate_model, maybe_lora, model_policy, sample_episodes, sample_items,
                     save_checkpoint)
from .learner import Learner
from .setup import check_model_path, prepare_policy
from .sft import plan_batches, prepare_sft_data, sft_epochs


def keep_successes(trajectories: list[Trajectory], dedupe: bool) -> list[Trajectory]:
    """The successful, error-free episodes; with `dedupe`, the first of each identical
    (item, token ids) episode only."""
    kept, seen = [], set()
    for t in trajectories:
        if not t.success or t.error is not None:
            continue
        key = (t.item_id, tuple(t.input_ids))
        if dedupe and key in seen:
            continue
        seen.add(key)
        kept.append(t)
    return kept


class RFTTrainer:
    """Rounds of sample → keep successes → fine-tune → evaluate.

    Args:
        config: the run's config.
        log: where progress lines go.
    """

    def __init__(self, config: RFTConfig, log: Callable[[str], Any] = print):
        self.config = config
        self.log = log
        registry.spec(config.env.id)
        self.train_tasks = registry.tasks(config.env.id, config.env.train_split)
        registry.tasks(config.env.id, config.env.eval_split)
        check_model_path(config.model.path)
        self.run_dir = config.run.dir

    def fit(self) -> list[dict[str, Any]]:
        """Run every round; returns one record per round (round 0 = the start) with the
        sampled success rate, successes kept, SFT losses and the evaluation summary."""
        cfg, rft = self.config, self.config.rft
        start_run(self.run_dir, cfg)
        seed = cfg.run.seed
        torch.manual_seed(seed)
        model, tokenizer = prepare_policy(cfg.model, cfg.env, cfg.warmup, cfg.rollout, self.run_dir, seed, self.log)
        model = maybe_lora(model, cfg.model, self.run_dir, tokenizer)
        learner = Learner(model, cfg.optim)
        policy = model_policy(model, tokenizer, rft.temperature, cfg.rollout.reuse_kv_cache)
        metrics = MetricsLogger(self.run_dir)
        pack_tokens = cfg.train.pack_tokens if cfg.train.packing else 0
        records = [{"round": 0, "eval": self._evaluate(model, tokenizer, metrics, 0)}]
        pool: list[Trajectory] = []
        for round_ in range(1, rft.rounds + 1):
            began = time.time()
            tasks = sample_items(self.train_tasks, rft.items, seed, f"rft-{round_}")
            sampled = sample_episodes(cfg.env, cfg.rollout, policy, tasks, rft.samples_per_item, rft.max_turns,
                                      seed, f"RFT round {round_}: sampling")
            save_trajectories(sampled, self.run_dir / "trajectories" / f"round_{round_:03d}.jsonl")
            successes = keep_successes(sampled, rft.dedupe)
            pool = pool + successes if rft.keep_previous else successes
            data, stats = prepare_sft_data(pool, cfg.train.max_tokens)
            sampled_s = time.time() - began
            losses: list[float] = []
            if data:
                steps = cfg.train.epochs * len(plan_batches([len(t.input_ids) for t in data],
                                                            cfg.train.batch_size, pack_tokens))
                with tqdm(total=steps, desc=f"RFT round {round_}: fine-tuning", unit="step") as bar:
                    losses = sft_epochs(learner, data, tokenizer.pad_token_id, cfg.train.epochs, cfg.train.batch_size,
                                        seed=seed * 1000 + round_, progress=bar.update, pack_tokens=pack_tokens,
                                        lr_schedule=cfg.optim.lr_schedule, warmup_steps=cfg.optim.lr_warmup_steps)
            else:
                self.log(f"round {round_}: no successful episode among {len(sampled)} samples; nothing to "
                         "fine-tune on (start from a model that sometimes succeeds, or raise rft.samples_per_item)")
            record = {
                "round": round_,
                "sample/success": sum(t.success for t in sampled) / len(sampled),
                "sample/items_solved": len({t.item_id for t in sampled if t.success}),
                "sample/errors": sum(t.error is not None for t in sampled),
                "sft/conversations": stats.kept, "sft/too_long": stats.too_long, "sft/tokens": stats.trained_tokens,
                **({"sft/loss_first_epoch": losses[0], "sft/loss_last_epoch": losses[-1]} if losses else {}),
                "time/sample_s": sampled_s, "time/finetune_s": time.time() - began - sampled_s,
            }
            save_checkpoint(learner, tokenizer, self.run_dir / "checkpoints" / f"round_{round_:03d}")
            metrics.log(round_, {k: v for k, v in record.items() if k != "round"})
            record["eval"] = self._evaluate(model, tokenizer, metrics, round_)
            self.log(f"round {round_}: sampled success {record['sample/success']:.3f} on {len(tasks)} items × "
                     f"{rft.samples_per_item}, kept {stats.kept} successes" +
                     (f", eval success {record['eval']['success']:.3f}" if record["eval"] else ""))
            records.append(record)
        metrics.close()
        return records

    def _evaluate(self, model: Any, tokenizer: Any, metrics: MetricsLogger, round_: int) -> dict[str, Any] | None:
        cfg = self.config
        if not cfg.eval.episodes:
            return None
        summary = evaluate_model(model, tokenizer, cfg.env, cfg.eval, cfg.rollout, cfg.run.seed)
        metrics.log(round_, eval_metrics(summary))
        return summary
