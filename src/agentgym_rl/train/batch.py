"""The learner's batch: trajectories padded into tensors, typed from collate to loss."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator

import torch

from ..algos import turn_ids_from_mask
from ..rollout.trajectory import Trajectory


@dataclass
class TokenBatch:
    """B right-padded token rows of width T (K: the most right tokens listed at one position).

    Built by `collate` (or `packing.collate_packed`); a trainer fills the optional fields its
    loss reads. Every tensor's first dimension is the row, so `rows` and `select` cut them all.

    Attributes:
        input_ids: (B, T) long; padding is the pad id.
        attention_mask: (B, T) long, 1 on real tokens.
        loss_mask: (B, T) float, 1 on the tokens trained on (the policy's own replies).
        old_logprobs: (B, T) float, log-probabilities of the policy that sampled the tokens
            (the generator's, or the learner's when it recomputes them), 0 off the loss mask.
        advantages: (B, T) float, per-token advantages (RL).
        returns: (B, T) float, value targets (PPO's critic).
        old_values: (B, T) float, the critic's values before the update (PPO's value clip).
        ref_logprobs: (B, T) float, the reference policy's log-probabilities (a KL term).
        generator_logprobs: (B, T) float, the generator's log-probabilities, kept when the
            learner's rescoring replaced them in `old_logprobs` (truncated importance sampling).
        right_ids: (B, T, K) long: at a rejected reply's wrong token, the tokens that would have
            continued a listed action; -1 everywhere else (the right-token loss).
        segment_ids: (B, T) long, a packed batch's document of each token (1..D, 0 on padding);
            a packed episode's context windows are documents too (`Trajectory.window_starts`).
        window_ids: (B, T) long, the context window of each token of an episode
            `rollout.keep_turns` cut (1..W, 0 on padding): the learner runs each window as a row
            of its own (`learner.window_hidden_state`).
        position_ids: (B, T) long, a packed or windowed batch's positions, restarting at every
            document or window.
        ref_sequence_logprobs: (B,) float, log π_ref(row) summed over the loss mask (DPO).
        row_weights: (B,) float, set by `Learner.update` on each micro-batch: what a term that
            is a mean over rows (`algos.right_token_loss`) weighs each row by, so that the
            micro-batches' weighted losses add up to that mean over the update's rows whether the
            learner weighs micro-batches by tokens or by rows.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    generator_logprobs: torch.Tensor | None = None
    right_ids: torch.Tensor | None = None
    segment_ids: torch.Tensor | None = None
    window_ids: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    ref_sequence_logprobs: torch.Tensor | None = None
    row_weights: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields that are set."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def rows(self, index: torch.Tensor | list[int]) -> TokenBatch:
        """The rows `index` of every field, at full width."""
        return dataclasses.replace(self, **{k: v[index] for k, v in self.tensors().items()})

    def select(self, index: torch.Tensor | list[int]) -> TokenBatch:
        """The rows `index`, every (B, T, ...) field trimmed to their longest row."""
        picked = self.rows(index)
        width = int(picked.attention_mask.sum(1).max().item()) if len(picked.attention_mask) else 0
        return dataclasses.replace(picked, **{k: v[:, :width] for k, v in picked.tensors().items() if v.dim() >= 2})

    def to(self, device: torch.device) -> TokenBatch:
        return dataclasses.replace(self, **{k: v.to(device, non_blocking=True) for k, v in self.tensors().items()})

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def trained_positions(self) -> torch.Tensor:
        """(B, T) bool: the tokens a loss reads the logprobs of (the loss mask and any right-token
        positions)."""
        return (self.loss_mask > 0) | self.right_token_positions()

    def right_token_positions(self) -> torch.Tensor:
        """(B, T) bool: the positions that list right tokens (none without `right_ids`)."""
        if self.right_ids is None:
            return torch.zeros_like(self.loss_mask, dtype=torch.bool)
        return (self.right_ids >= 0).any(-1)


def collate(trajectories: list[Trajectory], pad_id: int, right_tokens: bool = False) -> TokenBatch:
    """Right-pad token records into a batch; with `right_tokens`, also `right_ids` from each
    row's `wrong_tokens` and `right_tokens`. A batch holding an episode of several context
    windows (`rollout.keep_turns`) gets `window_ids` and `position_ids`, so that each reply is
    scored on the window it was written in."""
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    shape = (len(trajectories), max(len(t.input_ids) for t in trajectories))
    batch = TokenBatch(input_ids=torch.full(shape, pad_id, dtype=torch.long),
                       attention_mask=torch.zeros(shape, dtype=torch.long),
                       loss_mask=torch.zeros(shape), old_logprobs=torch.zeros(shape))
    for row, t in enumerate(trajectories):
        n = len(t.input_ids)
        batch.input_ids[row, :n] = torch.tensor(t.input_ids, dtype=torch.long)
        batch.attention_mask[row, :n] = 1
        batch.loss_mask[row, :n] = torch.tensor(t.loss_mask, dtype=torch.float)
        if t.logprobs:
            batch.old_logprobs[row, :n] = torch.tensor(t.logprobs, dtype=torch.float)
    if any(t.window_starts for t in trajectories):
        batch.window_ids = torch.zeros(shape, dtype=torch.long)
        batch.position_ids = torch.zeros(shape, dtype=torch.long)
        for row, t in enumerate(trajectories):
            mark_windows(batch.window_ids, batch.position_ids, row, 0, t, first=1)
    if right_tokens:
        most = max([len(ids) for t in trajectories for ids in t.right_tokens] + [1])
        batch.right_ids = torch.full((*shape, most), -1, dtype=torch.long)
        for row, t in enumerate(trajectories):
            for position, ids in zip(t.wrong_tokens, t.right_tokens):
                batch.right_ids[row, position, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return batch


def mark_windows(ids: torch.Tensor, positions: torch.Tensor, row: int, offset: int, trajectory: Trajectory,
                 first: int) -> int:
    """Number `trajectory`'s context windows, placed at `offset` of `row`, `first`, `first` + 1,
    ... in `ids` (B, T), their `positions` (B, T) restarting at each; returns the next number."""
    number = first
    for number, (start, end) in enumerate(trajectory.windows(), start=first):
        ids[row, offset + start:offset + end] = number
        positions[row, offset + start:offset + end] = torch.arange(end - start)
    return number + 1


def micro_batches(batch: TokenBatch, size: int, max_tokens: int = 0,
                  group: int = 1) -> Iterator[tuple[list[int], TokenBatch]]:
    """Slices of at most `size` rows, each trimmed of padding, as (row indices, micro-batch);
    with `max_tokens`, also at most that many token cells (rows × the longest row), but never
    less than one group.

    Rows are taken in order of length, so rows of similar length share a micro-batch: in
    multi-turn data lengths vary several-fold and padding would be most of the work. With
    `group` > 1 each run of `group` consecutive rows (DPO's chosen and rejected rows) stays
    together and in its order, groups ordered by their longest row; `size` then counts whole
    groups' rows (rounded down to a multiple of `group`, one group at least).
    """
    lengths = batch.attention_mask.sum(1).tolist()
    if len(lengths) % group:
        raise ValueError(f"a batch of {len(lengths)} rows is not made of groups of {group}")
    groups = [list(range(start, start + group)) for start in range(0, len(lengths), group)]
    widths = [max(lengths[row] for row in rows) for rows in groups]
    for taken in pack_by_width(widths, [group] * len(groups), max(1, size // group) * group, max_tokens):
        rows = [row for g in taken for row in groups[g]]
        yield rows, batch.select(rows)


def pack_by_width(widths: list[int], rows: list[int], size: int, max_tokens: int = 0,
                  cell_rows: list[int] | None = None) -> list[list[int]]:
    """Units (groups of rows, tree rows) into micro-batches, narrowest first, as lists of unit
    indices: a micro-batch holds at most `size` rows (unit u brings `rows[u]`) and, with
    `max_tokens`, at most that many token cells (its tensor rows, `cell_rows[u]` a unit, default
    `rows`, times its widest unit), never less than one unit. Ties keep the units' order."""
    cell_rows = rows if cell_rows is None else cell_rows
    out: list[list[int]] = []
    taken: list[int] = []
    for unit in sorted(range(len(widths)), key=lambda u: widths[u]):
        # Units come narrowest first, so the one being added is the widest of its micro-batch.
        over_rows = sum(rows[u] for u in taken) + rows[unit] > size
        over_cells = max_tokens and (sum(cell_rows[u] for u in taken) + cell_rows[unit]) * widths[unit] > max_tokens
        if taken and (over_rows or over_cells):
            out.append(taken)
            taken = []
        taken.append(unit)
    if taken:
        out.append(taken)
    return out


def turn_state_ids(trajectories: list[Trajectory], mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: on each action token, an id of the state its turn was taken from
    (`Trajectory.state_keys`), equal ids for equal keys across the batch; -1 off the mask and
    on turns without a key. Turn k of a row is its k-th run of action tokens (GiGPO's
    ``state_ids`` field).

    Args:
        trajectories: the B rows of `mask`.
        mask: (B, T) 0/1 action mask, as collated from them.
    """
    if len(trajectories) != mask.shape[0]:
        raise ValueError(f"{len(trajectories)} trajectories for a mask of {mask.shape[0]} rows")
    ids: dict[str, int] = {}
    turns = turn_ids_from_mask(mask)
    out = torch.full_like(turns, -1)
    for row, t in enumerate(trajectories):
        per_turn = torch.tensor([ids.setdefault(key, len(ids)) if key else -1 for key in t.state_keys] + [-1],
                                dtype=torch.long)
        # A turn past the recorded keys (none recorded) reads the trailing -1.
        out[row] = torch.where(turns[row] >= 0, per_turn[turns[row].clamp(0, len(t.state_keys))], out[row])
    return out
