"""Supervised fine-tuning on conversations: loss on trained assistant tokens (and, weighted, the rest).

Conversations are encoded by the same `ChatEncoder` rule as rollouts, so demonstrations and
sampled trajectories share one token layout. The loss is the mean negative log-likelihood
over the loss-mask tokens of a batch:

    L = − Σ_{b,t} m[b,t] · log π(x[b,t] | x[b,<t]) / Σ_{b,t} m[b,t]

where m is 1 on the tokens of assistant replies that carry loss (AgentGym's per-turn
``loss: false`` turns stay in the context with m = 0) and, with a `context_loss_weight` w > 0,
w on every other token (`with_context_loss`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..agent.chat import ChatEncoder
from ..rollout.formats import sft_messages
from ..rollout.trajectory import Trajectory
from .batch import TokenBatch, collate
from .learner import Learner, TokenOutputs
from .packing import collate_packed, pack


def encode_demonstrations(encoder: ChatEncoder, trajectories: list[Trajectory]) -> list[Trajectory]:
    """Fill `input_ids`/`loss_mask` of text-only trajectories (e.g. expert demonstrations).

    Per-message ``loss`` flags are honoured (`formats.sft_messages`): an assistant turn with
    ``loss: false`` gets loss_mask 0. Raises ValueError for a conversation without an
    assistant message.
    """
    encoded = []
    for t in trajectories:
        messages, train_on = sft_messages(t)
        ids, mask = encoder.encode_conversation(messages, train_on)
        encoded.append(Trajectory(env_id=t.env_id, item_id=t.item_id, category=t.category,
                                  messages=t.messages, input_ids=ids, loss_mask=mask,
                                  turn_rewards=t.turn_rewards, success=t.success))
    return encoded


@dataclass
class SFTDataStats:
    """What `prepare_sft_data` kept and why it left the rest out.

    Attributes:
        conversations: conversations given.
        kept: conversations that will be trained on.
        no_loss: left out because no assistant token carries loss (every assistant turn has
            ``loss: false``, or there is no assistant turn).
        too_long: left out because longer than the token limit.
        trained_turns: assistant turns that carry loss, over the kept conversations.
        trained_tokens: loss-mask tokens over the kept conversations.
    """

    conversations: int
    kept: int
    no_loss: int
    too_long: int
    trained_turns: int
    trained_tokens: int

    def describe(self) -> str:
        return (f"{self.kept} of {self.conversations} conversations ({self.trained_turns} trained assistant turns, "
                f"{self.trained_tokens} trained tokens); left out: {self.no_loss} with no trained turn, "
                f"{self.too_long} over the token limit")


def prepare_sft_data(trajectories: list[Trajectory], max_tokens: int,
                     encoder: ChatEncoder | None = None) -> tuple[list[Trajectory], SFTDataStats]:
    """Encode (when `encoder` is given) and keep the conversations that can be trained on.

    Args:
        trajectories: text-only conversations (with an encoder), or trajectories that
            already hold their token ids (encoder None: e.g. sampled rollouts, kept exactly
            as sampled).
        max_tokens: leave out conversations longer than this (attention cost grows with the
            square of the length).
    Returns:
        (kept trajectories with input_ids and loss_mask, stats).
    """
    kept, no_loss, too_long = [], 0, 0
    for t in trajectories:
        if encoder is not None:
            if not any(m["role"] == "assistant" for m in t.messages):
                no_loss += 1
                continue
            [t] = encode_demonstrations(encoder, [t])
        if not any(t.loss_mask):
            no_loss += 1
        elif len(t.input_ids) > max_tokens:
            too_long += 1
        else:
            kept.append(t)
    stats = SFTDataStats(conversations=len(trajectories), kept=len(kept), no_loss=no_loss, too_long=too_long,
                         trained_turns=sum(len(t.replies()) for t in kept),
                         trained_tokens=sum(sum(t.loss_mask) for t in kept))
    return kept, stats


def with_context_loss(trajectory: Trajectory, weight: float) -> Trajectory:
    """`trajectory` whose loss mask also weights every other token `weight` (the replies keep
    1; the first token, which nothing predicts, stays 0): a weighted token-mean loss."""
    mask = [1.0 if trained else weight for trained in trajectory.loss_mask]
    mask[0] = 0.0
    return dataclasses.replace(trajectory, loss_mask=mask)


def nll_loss(batch: TokenBatch, outputs: TokenOutputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood over loss-mask tokens, weighted by the mask's values (0/1
    unless `with_context_loss` weighted the context); outputs.logprobs: (B, T)."""
    mask = batch.loss_mask
    loss = -(outputs.logprobs * mask).sum() / mask.sum().clamp(min=torch.finfo(mask.dtype).tiny)
    return loss, {}


def plan_batches(lengths: list[int], batch_size: int, pack_tokens: int = 0,
                 rng: random.Random | None = None, window: int = 8) -> list[list[list[int]]]:
    """Optimizer-step batches as lists of rows, a row as a list of conversation indices.

    Without packing (`pack_tokens` 0) each row is one conversation; with packing,
    conversations are first packed into rows of at most `pack_tokens` tokens
    (`packing.pack`). Rows of similar length go together (padding is most of the cost of
    multi-turn data):

    - without `rng`, rows are sorted by length and cut into batches of `batch_size`
      (deterministic; used to count steps);
    - with `rng`, rows are shuffled, cut into windows of `window * batch_size` rows, and
      each window is sorted by length and cut into batches, whose order is shuffled again.
      Re-drawn every epoch, batches then mix conversations of different kinds: a global
      length sort puts the same conversations (often of one level) together in every epoch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rows = pack(lengths, pack_tokens) if pack_tokens else [[i] for i in range(len(lengths))]

    def by_length(some: list[list[int]]) -> list[list[int]]:
        return sorted(some, key=lambda row: (sum(lengths[i] for i in row), row))

    if rng is None:
        ordered = by_length(rows)
        return [ordered[start:start + batch_size] for start in range(0, len(ordered), batch_size)]
    rows = list(rows)
    rng.shuffle(rows)
    span = max(window, 1) * batch_size
    batches = []
    for begin in range(0, len(rows), span):
        ordered = by_length(rows[begin:begin + span])
        batches += [ordered[start:start + batch_size] for start in range(0, len(ordered), batch_size)]
    rng.shuffle(batches)
    return batches


def lr_multiplier(schedule: str, step: int, total_steps: int, warmup_steps: int = 0) -> float:
    """The learning-rate factor at optimizer step `step` (0-based) of `total_steps`.

    Linear warm-up from 0 over `warmup_steps`, then "constant" (1) or "cosine" (half a cosine
    from 1 down to 0 at `total_steps`, as in Loshchilov & Hutter 2017, SGDR, without restarts).
    """
    check_lr_schedule(schedule, warmup_steps)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


LR_SCHEDULES = ("constant", "cosine")


def check_lr_schedule(schedule: str, warmup_steps: int = 0) -> None:
    """Raise ValueError for an unknown schedule name or a negative warm-up."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; known: {', '.join(LR_SCHEDULES)}")
    if warmup_steps < 0:
        raise ValueError(f"lr warm-up steps must be >= 0, got {warmup_steps}")


def sft_epochs(learner: Learner, data: list[Trajectory], pad_id: int, epochs: int, batch_size: int,
               seed: int = 0, progress: Any = None, pack_tokens: int = 0,
               on_step: Callable[[dict[str, float]], Any] | None = None,
               on_epoch: Callable[[int, float], Any] | None = None,
               lr_schedule: str = "constant", warmup_steps: int = 0, context_weight: float = 0.0) -> list[float]:
    """Train on `data` (encoded trajectories) for `epochs` passes, batches re-drawn each epoch.

    Args:
        learner: holds the model and optimizer; one optimizer step per batch.
        data: trajectories with input_ids and loss_mask.
        batch_size: conversations per step, or packed rows per step with `pack_tokens`.
        pack_tokens: pack conversations into rows of at most this many tokens with
            document-local attention (0 = no packing); see `plan_batches`.
        progress: called with 1 after each step.
        on_step: called after each step with the learner's metrics plus "epoch", "lr",
            "conversations" and "tokens" (loss tokens) of the step.
        on_epoch: called after each epoch with (epoch number from 1, its mean loss).
        lr_schedule, warmup_steps: the learning rate over these epochs' steps as a factor of
            the optimizer's (`lr_multiplier`).
        context_weight: weight of the loss on the tokens outside the replies
            (`with_context_loss`; 0: replies only).
    Returns:
        the mean loss of each epoch (mean of the steps' token-mean losses).
    """
    rng = random.Random(seed)
    if context_weight > 0:
        data = [with_context_loss(t, context_weight) for t in data]
    lengths = [len(t.input_ids) for t in data]
    total = epochs * len(plan_batches(lengths, batch_size, pack_tokens))
    base_lrs = [group["lr"] for group in learner.optimizer.param_groups]
    step = 0
    epoch_losses = []
    try:
        for epoch in range(epochs):
            losses = []
            for rows in plan_batches(lengths, batch_size, pack_tokens, rng):
                factor = lr_multiplier(lr_schedule, step, total, warmup_steps)
                for group, base in zip(learner.optimizer.param_groups, base_lrs):
                    group["lr"] = base * factor
                if pack_tokens:
                    batch = collate_packed([[data[i] for i in row] for row in rows], pad_id)
                else:
                    batch = collate([data[row[0]] for row in rows], pad_id)
                metrics = learner.update(batch, nll_loss)
                step += 1
                losses.append(metrics.get("loss", 0.0))
                if on_step is not None:
                    on_step({**metrics, "epoch": epoch + 1, "lr": base_lrs[0] * factor,
                             "conversations": sum(len(row) for row in rows),
                             "tokens": float(batch.loss_mask.sum())})
                if progress is not None:
                    progress(1)
            epoch_losses.append(sum(losses) / max(len(losses), 1))
            if on_epoch is not None:
                on_epoch(epoch + 1, epoch_losses[-1])
    finally:
        # The learner may train on (RFT's next round): leave its learning rate as found.
        for group, base in zip(learner.optimizer.param_groups, base_lrs):
            group["lr"] = base
    return epoch_losses
