"""The DPO trainer (`agentgym-rl dpo`): trajectory-level Direct Preference Optimization.

Pairs (y_w, y_l) are two trajectories of the same item, the preferred one succeeded (or,
with equal outcome, earned more reward; `train.pairs.build_pairs`). A trajectory's
log-probability is the sum over its trained reply tokens (`algos.sequence_logprob`), and the
loss is `algos.dpo_loss`:

    loss = mean over pairs of −log σ(β · [(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))])

The reference π_ref is the starting policy. Its log-probabilities are constants, so they are
computed once, before the first update: without LoRA, by the model itself before it changes
(identical to scoring with a frozen copy, without keeping the copy in memory); with LoRA, by
the base with the adapter switched off (`Learner.outputs(batch, reference=True)`).

Trajectories come from `data.path` (re-encoded from their text with this model's chat
template, since a file may come from another tokenizer) or are sampled with the starting
policy (`data.samples_per_item` per item; ids kept exactly as sampled).

Run folder as for SFT, plus `trajectories/samples.jsonl` when sampling; metrics.jsonl has
one line per optimizer step (loss, rewards/*, grad_norm) and, with `eval.episodes`, val/*
at step 0 (the starting policy) and at the last step.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any, Callable

import torch
from ..progress import progress_bar

from ..agent.chat import ChatEncoder
from ..algos import dpo_loss, sequence_logprob
from ..config import DPOConfig
from ..envs import registry
from ..errors import UserError
from ..rollout.formats import load_conversations
from ..rollout.trajectory import Trajectory, save_trajectories
from .batch import TokenBatch, collate
from .finetune import prepare_sft_data
from .. import metric_names as metric
from .learner import Learner, TokenOutputs, is_lora
from .pairs import PairStats, build_pairs
from .session import Session, Trainer, eval_metrics, holds_run_folder, sample_items

Pair = tuple[Trajectory, Trajectory]


def no_pairs_error(trajectories: list[Trajectory], stats: PairStats, config: DPOConfig, source: str) -> UserError:
    """Why no pair could be made, and what to change."""
    by_item: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.error is None:
            by_item.setdefault(t.item_id, []).append(t)
    single = sum(len(g) == 1 for g in by_item.values())
    all_won = sum(len(g) > 1 and all(t.success for t in g) for g in by_item.values())
    all_lost = sum(len(g) > 1 and not any(t.success for t in g) for g in by_item.values())
    why = (f"DPO found no preference pair among {len(trajectories)} trajectories of {stats.items} items from {source} "
           f"({single} items have one trajectory, {all_won} only successes, {all_lost} only failures; "
           f"{stats.errored} errored): a pair needs two trajectories of one item where one succeeded and the other "
           f"failed, or whose rewards differ by at least pairs.min_margin={config.pairs.min_margin}")
    if config.data.path is not None:
        scored = any(t.success or t.turn_rewards for t in trajectories)
        hint = ("give several trajectories per item_id with success and reward fields (`agentgym-rl collect "
                "--samples K` writes them)" if scored else
                "the file's records carry no success or reward at all: DPO needs scored trajectories")
    else:
        hint = (f"sample more per item (data.samples_per_item={config.data.samples_per_item}) or more items "
                f"(data.items={config.data.items}), raise data.temperature ({config.data.temperature}), or start "
                "from a model that solves some items but not all")
    return UserError(f"{why}; {hint}")


def pair_batch(pairs: list[Pair], reference: dict[int, float], pad_id: int) -> TokenBatch:
    """Rows chosen₀, rejected₀, chosen₁, rejected₁, ... (B = 2·pairs) with their reference
    log-probabilities: interleaved so that a micro-batch of even size holds whole pairs."""
    rows = [t for pair in pairs for t in pair]
    batch = collate(rows, pad_id)
    batch.ref_sequence_logprobs = torch.tensor([reference[id(t)] for t in rows])
    return batch


def make_loss(beta: float, label_smoothing: float) -> Callable[[TokenBatch, dict[str, torch.Tensor]], Any]:
    """The Learner loss of interleaved pair rows: DPO on per-trajectory summed logprobs."""

    def loss(batch: TokenBatch, outputs: TokenOutputs) -> tuple[torch.Tensor, dict[str, float]]:
        policy = sequence_logprob(outputs.logprobs, batch.loss_mask)  # (B,)
        ref = batch.ref_sequence_logprobs
        return dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], beta=beta,
                        label_smoothing=label_smoothing)

    return loss


class DPOTrainer(Trainer):
    """DPO of one policy on pairs of its own (or a file's) trajectories."""

    config: DPOConfig

    def make_pairs(self, trajectories: list[Trajectory], source: str) -> list[Pair]:
        p = self.config.pairs
        pairs, stats = build_pairs(trajectories, min_margin=p.min_margin, use_reward=p.use_reward,
                                   max_pairs_per_item=p.max_pairs_per_item, seed=self.config.run.seed)
        if not pairs:
            raise no_pairs_error(trajectories, stats, self.config, source)
        self.log(f"DPO pairs from {source}: {stats.pairs} pairs over {stats.items_paired} of {stats.items} items "
                 f"({stats.pairs_capped} left out by pairs.max_pairs_per_item, {stats.errored} errored trajectories)")
        self.pair_stats = stats
        return pairs

    def sample(self, session: Session) -> list[Trajectory]:
        """`data.samples_per_item` episodes of the starting policy on `data.items` random train items."""
        cfg, data = self.config, self.config.data
        tasks = sample_items(registry.tasks(cfg.env.id, cfg.env.train_split, cfg.env.kwargs), data.items, cfg.run.seed, "dpo")
        trajectories = session.sample(tasks, data.samples_per_item, data.temperature, data.max_turns, "DPO samples")
        save_trajectories(trajectories, self.run_dir / "trajectories" / "samples.jsonl")
        return trajectories

    def reference_logprobs(self, learner: Learner, trajectories: list[Trajectory], pad_id: int,
                           chunk: int = 32) -> dict[int, float]:
        """log π_ref(y) of each trajectory (keyed by id()), before any update."""
        reference = is_lora(learner.model)
        out: dict[int, float] = {}
        for start in range(0, len(trajectories), chunk):
            rows = trajectories[start:start + chunk]
            batch = collate(rows, pad_id)
            logprobs = learner.outputs(batch, reference=reference).logprobs
            for t, value in zip(rows, sequence_logprob(logprobs, batch.loss_mask).tolist()):
                out[id(t)] = value
        return out

    @holds_run_folder
    def fit(self) -> dict[str, Any]:
        """Train; returns {"run_dir", "model", "pairs", "before", "after"} (summaries or None)."""
        cfg = self.config
        pairs: list[Pair] = []
        if cfg.data.path is not None:
            # Pairs first: a file without usable pairs fails before any model is built.
            trajectories = load_conversations(cfg.data.path, instruction_as_system=cfg.data.instruction_as_system)
            pairs = self.make_pairs(trajectories, repr(cfg.data.path))
        session = Session.start(cfg, self.log)
        tokenizer, learner, metrics = session.tokenizer, session.learner, session.metrics
        before = after = None
        if cfg.eval.episodes:
            before = session.evaluate()
            metrics.log(0, eval_metrics(before))
        if cfg.data.path is None:
            pairs = self.make_pairs(self.sample(session), f"{cfg.data.items} sampled items")
        else:
            pairs = self.encode_pairs(pairs, tokenizer)
        built = len(pairs)
        pairs = [(c, r) for c, r in pairs if max(len(c.input_ids), len(r.input_ids)) <= cfg.dpo.max_tokens
                 and any(c.loss_mask) and any(r.loss_mask)]
        if not pairs:
            raise UserError(f"every DPO pair has a trajectory longer than dpo.max_tokens={cfg.dpo.max_tokens} "
                            "or without trained tokens: raise dpo.max_tokens")
        if len(pairs) < built:
            self.log(f"{built - len(pairs)} of {built} pairs left out: a trajectory longer than "
                     f"dpo.max_tokens={cfg.dpo.max_tokens} or without trained tokens")
        unique = list({id(t): t for pair in pairs for t in pair}.values())
        reference = self.reference_logprobs(learner, unique, tokenizer.pad_token_id)
        metrics.log(0, {"pairs": len(pairs), metric.pairs("built"): built,
                        metric.pairs("items"): self.pair_stats.items_paired, metric.pairs("trajectories"): len(unique)})
        loss = make_loss(cfg.dpo.beta, cfg.dpo.label_smoothing)
        rng = random.Random(cfg.run.seed)
        step = 0
        per_epoch = -(-len(pairs) // cfg.dpo.batch_size)
        with progress_bar(total=cfg.dpo.epochs * per_epoch, desc="DPO", unit="step") as bar:
            for epoch in range(cfg.dpo.epochs):
                order = list(range(len(pairs)))
                rng.shuffle(order)
                for start in range(0, len(order), cfg.dpo.batch_size):
                    chunk = [pairs[i] for i in order[start:start + cfg.dpo.batch_size]]
                    values = learner.update(pair_batch(chunk, reference, tokenizer.pad_token_id), loss,
                                            weight_by="sequences", group=2)
                    step += 1
                    metrics.log(step, {**values, "epoch": epoch + 1})
                    bar.update(1)
                    bar.set_postfix(loss=f"{values['loss']:.3f}", acc=f"{values[metric.DPO_ACCURACY]:.2f}")
        folder = session.save("final")
        if cfg.eval.episodes:
            after = session.evaluate()
            metrics.log(step, eval_metrics(after))
        metrics.close()
        return {"run_dir": self.run_dir, "model": folder, "pairs": len(pairs), "pair_stats": asdict(self.pair_stats),
                "before": before, "after": after}

    def encode_pairs(self, pairs: list[Pair], tokenizer: Any) -> list[Pair]:
        """The file's pairs with input_ids/loss_mask from this model's template (one encoding
        per trajectory, shared by every pair it is in)."""
        encoder = ChatEncoder(tokenizer)
        encoded: dict[int, Trajectory] = {}
        for pair in pairs:
            for t in pair:
                if id(t) not in encoded:
                    # No length limit here: over-long pairs are dropped together below.
                    kept, _ = prepare_sft_data([t], max_tokens=2**62, encoder=encoder)
                    encoded[id(t)] = kept[0] if kept else Trajectory(t.env_id, t.item_id, t.category)
        return [(encoded[id(c)], encoded[id(r)]) for c, r in pairs]
