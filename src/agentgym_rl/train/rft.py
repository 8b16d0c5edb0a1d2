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

from ..progress import progress_bar

from ..config import RFTConfig
from ..envs import registry
from ..eval.metrics import Summary
from ..rollout.trajectory import Trajectory, save_trajectories
from .finetune import plan_batches, prepare_sft_data, sft_epochs
from .session import Session, Trainer, eval_metrics, holds_run_folder, sample_items
from .. import metric_names as metric


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


class RFTTrainer(Trainer):
    """Rounds of sample → keep successes → fine-tune → evaluate."""

    def __init__(self, config: RFTConfig, log: Callable[[str], Any] = print):
        super().__init__(config, log)
        self.train_tasks = registry.tasks(config.env.id, config.env.train_split, config.env.kwargs)

    @holds_run_folder
    def fit(self) -> list[dict[str, Any]]:
        """Run every round; returns one record per round (round 0 = the start) with the
        sampled success rate, successes kept, SFT losses and the evaluation summary."""
        cfg, rft = self.config, self.config.rft
        seed = cfg.run.seed
        session = Session.start(cfg, self.log)
        tokenizer, learner, metrics = session.tokenizer, session.learner, session.metrics
        pack_tokens = cfg.train.pack_tokens if cfg.train.packing else 0
        records = [{"round": 0, "eval": self._evaluate(session, 0)}]
        pool: list[Trajectory] = []
        for round_ in range(1, rft.rounds + 1):
            began = time.time()
            tasks = sample_items(self.train_tasks, rft.items, seed, f"rft-{round_}")
            sampled = session.sample(tasks, rft.samples_per_item, rft.temperature, rft.max_turns,
                                     f"RFT round {round_}: sampling")
            save_trajectories(sampled, self.run_dir / "trajectories" / f"round_{round_:03d}.jsonl")
            successes = keep_successes(sampled, rft.dedupe)
            pool = pool + successes if rft.keep_previous else successes
            data, stats = prepare_sft_data(pool, cfg.train.max_tokens)
            sampled_s = time.time() - began
            losses: list[float] = []
            if data:
                steps = cfg.train.epochs * len(plan_batches([len(t.input_ids) for t in data],
                                                            cfg.train.batch_size, pack_tokens))
                with progress_bar(total=steps, desc=f"RFT round {round_}: fine-tuning", unit="step") as bar:
                    losses = sft_epochs(learner, data, tokenizer.pad_token_id, cfg.train.epochs, cfg.train.batch_size,
                                        seed=seed * 1000 + round_, progress=bar.update, pack_tokens=pack_tokens,
                                        lr_schedule=cfg.optim.lr_schedule, warmup_steps=cfg.optim.lr_warmup_steps,
                                        context_weight=cfg.train.context_loss_weight)
            else:
                self.log(f"round {round_}: no successful episode among {len(sampled)} samples; nothing to "
                         "fine-tune on (start from a model that sometimes succeeds, or raise rft.samples_per_item)")
            record = {
                "round": round_,
                metric.SAMPLE_SUCCESS: sum(t.success for t in sampled) / len(sampled),
                metric.SAMPLE_ITEMS_SOLVED: len({t.item_id for t in sampled if t.success}),
                metric.SAMPLE_ERRORS: sum(t.error is not None for t in sampled),
                metric.SFT_CONVERSATIONS: stats.kept, metric.SFT_TOO_LONG: stats.too_long, metric.SFT_TOKENS: stats.trained_tokens,
                **({metric.SFT_LOSS_FIRST_EPOCH: losses[0], metric.SFT_LOSS_LAST_EPOCH: losses[-1]} if losses else {}),
                metric.TIME_SAMPLE_S: sampled_s, metric.TIME_FINETUNE_S: time.time() - began - sampled_s,
            }
            session.save(f"round_{round_:03d}")
            metrics.log(round_, {k: v for k, v in record.items() if k != "round"})
            record["eval"] = self._evaluate(session, round_)
            self.log(f"round {round_}: sampled success {record[metric.SAMPLE_SUCCESS]:.3f} on {len(tasks)} items × "
                     f"{rft.samples_per_item}, kept {stats.kept} successes" +
                     (f", eval success {record['eval'].success:.3f}" if record["eval"] else ""))
            records.append(record)
        metrics.close()
        return records

    def _evaluate(self, session: Session, round_: int) -> Summary | None:
        if not self.config.eval.episodes:
            return None
        summary = session.evaluate()
        session.metrics.log(round_, eval_metrics(summary))
        return summary
