"""Sequence packing: several short conversations in one row, attention kept inside each.

A packed row holds documents d = 1..D back to back, then padding:

    input_ids   [a a a a b b b c c 0 0]
    segment_ids [1 1 1 1 2 2 2 3 3 0 0]     (0 = padding)
    position_ids[0 1 2 3 0 1 2 0 1 0 0]     (restart per document)

Token t may attend to token s iff s ≤ t and segment[s] = segment[t] ≠ 0: a block-diagonal
causal mask, passed to the model as a 4-D additive mask (0 = attend, dtype-min = blocked)
together with restarted position ids. With it every document's logits equal those of the
document run alone (checked in tests), so packing changes cost, never the loss.

Hugging Face models accept such a 4-D mask with the default SDPA attention and with eager
attention on CPU. Attention is still computed densely over the packed row (O(T²) per row),
so packing saves the padding of the MLP and projection layers, not attention work.
"""

from __future__ import annotations

import torch

from ..rollout.trajectory import Trajectory
from .batch import TokenBatch, mark_windows


def pack(lengths: list[int], capacity: int) -> list[list[int]]:
    """Group documents into rows of at most `capacity` tokens (first-fit decreasing).

    A document longer than `capacity` gets a row of its own.

    Args:
        lengths: token count of each document.
        capacity: most tokens in a row.
    Returns:
        rows as lists of document indices; within a row, in the order placed.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    rows: list[list[int]] = []
    room: list[int] = []
    # Longest first, ties by index, so the result is deterministic.
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def collate_packed(rows: list[list[Trajectory]], pad_id: int) -> TokenBatch:
    """Right-padded batch of packed rows.

    Returns:
        input_ids (B, T) long, attention_mask (B, T) long (1 on real tokens), loss_mask (B, T)
        float, old_logprobs (B, T) float, segment_ids (B, T) long (1..D per row, 0 on
        padding) and position_ids (B, T) long (restarting at 0 for every document; each context
        window of an episode `rollout.keep_turns` cut is a document of its own).
    """
    if not rows or not all(rows):
        raise ValueError("cannot collate an empty row")
    width = max(sum(len(t.input_ids) for t in row) for row in rows)
    shape = (len(rows), width)
    batch = TokenBatch(input_ids=torch.full(shape, pad_id, dtype=torch.long),
                       attention_mask=torch.zeros(shape, dtype=torch.long),
                       loss_mask=torch.zeros(shape), old_logprobs=torch.zeros(shape),
                       segment_ids=torch.zeros(shape, dtype=torch.long),
                       position_ids=torch.zeros(shape, dtype=torch.long))
    for r, row in enumerate(rows):
        start, d = 0, 1
        for t in row:
            n = len(t.input_ids)
            span = slice(start, start + n)
            batch.input_ids[r, span] = torch.tensor(t.input_ids, dtype=torch.long)
            batch.attention_mask[r, span] = 1
            batch.loss_mask[r, span] = torch.tensor(t.loss_mask, dtype=torch.float)
            if t.logprobs:
                batch.old_logprobs[r, span] = torch.tensor(t.logprobs, dtype=torch.float)
            d = mark_windows(batch.segment_ids, batch.position_ids, r, start, t, first=d)
            start += n
    return batch


def block_causal_mask(segment_ids: torch.Tensor, dtype: torch.dtype = torch.float32,
                      window: int | None = None) -> torch.Tensor:
    """(B, 1, T, T) additive mask: 0 where query t may attend to key s, dtype-min elsewhere.

    allowed[b, t, s] = (s ≤ t) ∧ (seg[b, s] = seg[b, t]) ∧ (seg[b, t] ≠ 0), and every padding
    position attends to itself only (an all-blocked row would give NaN, which would reach
    the gradient through 0 · NaN even though padding carries no loss). With a `window`
    (sliding-window attention) also t - s < window.
    """
    rows, width = segment_ids.shape
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    if window is not None:
        causal = causal.triu(-(window - 1))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = (segment_ids != 0)[:, :, None]
    allowed = (causal & same & real) | torch.eye(width, dtype=torch.bool)
    mask = torch.zeros(rows, 1, width, width, dtype=dtype)
    return mask.masked_fill(~allowed[:, None], torch.finfo(dtype).min)
