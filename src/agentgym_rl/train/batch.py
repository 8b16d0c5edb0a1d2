"""Padding trajectories into tensors for the learner."""

from __future__ import annotations

from typing import Iterator

import torch

from ..rollout.trajectory import Trajectory

TokenBatch = dict[str, torch.Tensor]


def collate(trajectories: list[Trajectory], pad_id: int, right_tokens: bool = False) -> TokenBatch:
    """Right-pad token records into a batch.

    Returns:
        input_ids (B, T) long, attention_mask (B, T) long, loss_mask (B, T) float,
        old_logprobs (B, T) float (behaviour logprobs, 0 off the mask); with `right_tokens`,
        also right_ids (B, T, K) long: at each of a row's `wrong_tokens`, its `right_tokens`,
        padded with -1 (everywhere else -1; K >= 1 is the largest set).
    """
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    width = max(len(t.input_ids) for t in trajectories)
    batch = {
        "input_ids": torch.full((len(trajectories), width), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(trajectories), width), dtype=torch.long),
        "loss_mask": torch.zeros((len(trajectories), width)),
        "old_logprobs": torch.zeros((len(trajectories), width)),
    }
    for row, t in enumerate(trajectories):
        n = len(t.input_ids)
        batch["input_ids"][row, :n] = torch.tensor(t.input_ids, dtype=torch.long)
        batch["attention_mask"][row, :n] = 1
        batch["loss_mask"][row, :n] = torch.tensor(t.loss_mask, dtype=torch.float)
        if t.logprobs:
            batch["old_logprobs"][row, :n] = torch.tensor(t.logprobs, dtype=torch.float)
    if right_tokens:
        most = max([len(ids) for t in trajectories for ids in t.right_tokens] + [1])
        batch["right_ids"] = torch.full((len(trajectories), width, most), -1, dtype=torch.long)
        for row, t in enumerate(trajectories):
            for position, ids in zip(t.wrong_tokens, t.right_tokens):
                batch["right_ids"][row, position, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return batch


def right_token_positions(batch: TokenBatch) -> torch.Tensor:
    """(B, T) bool: the positions of a `collate(..., right_tokens=True)` batch that list right tokens."""
    return (batch["right_ids"] >= 0).any(-1)


def select(batch: TokenBatch, rows: torch.Tensor | list[int]) -> TokenBatch:
    """The rows `rows` of every (B, ...) tensor, (B, T, ...) ones trimmed to their longest sequence."""
    picked = {k: v[rows] for k, v in batch.items()}
    width = int(picked["attention_mask"].sum(1).max().item()) if len(picked["attention_mask"]) else 0
    return {k: (v[:, :width] if v.dim() >= 2 else v) for k, v in picked.items()}


def micro_batches(batch: TokenBatch, size: int) -> Iterator[tuple[list[int], TokenBatch]]:
    """Slices of at most `size` rows, each trimmed of padding, as (row indices, micro-batch).

    Rows are taken in order of length, so rows of similar length share a micro-batch: in
    multi-turn data lengths vary several-fold and padding would be most of the work.
    """
    lengths = batch["attention_mask"].sum(1).tolist()
    order = sorted(range(len(lengths)), key=lambda row: lengths[row])
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        yield rows, select(batch, rows)
