"""A KV cache of preallocated per-row slots, each row at its own position: the cache of the
CUDA-graph decoding backend (docs/SCALING.md, "A CUDA-graph decoding backend").

transformers' `StaticCache` writes every row at one shared position, so rows of a batch cannot
sit at their own turn of their own episode; `DynamicCache` grows a column every step and must be
re-packed between turns. Here each row (slot) keeps its episode's keys and values in place
across turns: a forward writes a row's new tokens at that row's length, its position ids are
that length onwards, and a 4D mask shows each query its row's cached columns and the new ones
up to itself. Every shape is fixed by (slots, max_len), and nothing in a step syncs the host:
what a CUDA graph needs. The same code runs eagerly on the CPU.

Shapes: B slots, H key/value heads, L = max_len columns, D head dim, Q new tokens a row this
forward, left-padded: a row's real tokens are its last ones, so that every row's next-token
logits are the last column's (the forward computes no others). A pad is written into the last
column, L - 1, which no real token ever sees: a slot holds L - 1 tokens.

Attention reads only the first W = `width` columns (a context bucket, W ≤ L, set for a call by
what its rows will hold): a step over a conversation of 1,000 tokens in slots of 8,192 reads an
eighth of the cache. A pad's query sees column 0 (any finite key will do: its output is never
read), so a slot whose tokens lie past W, idle in this call, is neither read nor written.

A decoding forward runs the first `batch` slots (a batch bucket, ≤ B, set for a call by its
rows, which the generator moves into them: `swap_rows`): a call of 3 episodes in a cache of 32
slots decodes 4 rows, not 32.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, (B, H, L, D), written at each row's own offset."""

    is_compileable = True

    def __init__(self, slots: "SlotCache"):
        super().__init__()
        self.slots = slots

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        shape = (self.slots.size, heads, self.slots.max_len)
        self.keys = key_states.new_zeros((*shape, key_states.shape[-1]))
        self.values = value_states.new_zeros((*shape, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (b, H, Q, D) new keys and values at columns lengths[r] .. lengths[r] + Q - 1 of
        each row r; returns those rows' first `width` columns, (b, H, W, D), which the step's mask
        reads (b: the `batch` leading slots, or a prefill's `rows`)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, width, batch = self.slots.rows, self.slots.width, self.slots.batch
        out = []
        for cache, new in ((self.keys, key_states), (self.values, value_states)):
            if rows is None:  # the leading slots (a decoding step): written in place, read as a view
                columns = self.slots.columns[:, None, :, None].expand(-1, new.shape[1], -1, new.shape[-1])
                cache[:batch].scatter_(2, columns, new.to(cache.dtype))
                out.append(cache[:batch, :, :width])
            else:  # some slots (a prefill): written at (row, column), their bucket read as a copy
                cache[rows[:, None], :, self.slots.columns] = new.to(cache.dtype).transpose(1, 2)
                out.append(cache[:, :, :width].index_select(0, rows))
        return out[0], out[1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.slots.width, 0

    def get_seq_length(self) -> int:
        return self.slots.width

    def get_max_length(self) -> int:
        return self.slots.max_len


class SlotCache(Cache):
    """`size` rows of `max_len` columns for a model of `num_layers` layers.

    Attributes:
        lengths: (B,) int64, the tokens each row holds (on `device`).
        columns: (B, Q) where the current forward writes each new token (`step` sets it).
        width: the columns attention reads (the context bucket; `max_len` until set): every
            real token of a forward must sit below it.
        batch: the leading slots a decoding forward runs (the batch bucket; `size` until set).
    A forward over it takes `step(Q, pads)`'s position ids and mask; then `advance(counts)` adds
    each row's real new tokens to its length.
    """

    def __init__(self, num_layers: int, size: int, max_len: int, device: Any = None):
        self.size, self.max_len = size, max_len
        self.lengths = torch.zeros(size, dtype=torch.long, device=device)
        self.columns = torch.zeros(size, 1, dtype=torch.long, device=device)
        self.rows: torch.Tensor | None = None
        self.width = max_len
        self.batch = size
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    def step(self, queries: int, pads: torch.Tensor | None = None,
             rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(position ids (b, Q), boolean mask (b, 1, Q, W)) of a forward of Q new tokens a row
        over the first `batch` slots, the first `pads[r]` of row r padding (None: none): real token
        q of row r sits at position lengths[r] + q - pads[r] (below `width`) and sees columns 0 up
        to its own; a pad is written into column L - 1 and sees column 0 only (a query that sees
        nothing would make NaNs). With `rows` (N,), the forward runs those slots alone, in that
        order (a prefill)."""
        device = self.lengths.device
        self.rows = None if rows is None else rows.to(device)
        lengths = self.lengths[:self.batch] if rows is None else self.lengths.index_select(0, self.rows)
        offsets = torch.arange(queries, device=device)[None, :]
        pads = torch.zeros_like(lengths) if pads is None else pads.to(device)
        positions = lengths[:, None] + offsets - pads[:, None]
        real = offsets >= pads[:, None]
        scratch = self.max_len - 1
        self.columns = torch.where(real, positions, scratch)
        seen = torch.arange(self.width, device=device)[None, None, None, :]
        mask = torch.where(real[:, None, :, None], seen <= positions[:, None, :, None], seen == 0)
        return positions.clamp(min=0), mask

    def copy_rows(self, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Give each row of `targets` (N,) the keys, values and length of the row of `sources`
        (N,): a group's prompt, prefilled once, in each of its samples' slots (its columns lie
        within the current `width`: only those are copied)."""
        for layer in self.layers:
            if layer.is_initialized:
                for cache in (layer.keys, layer.values):
                    cache[:, :, :self.width].index_copy_(0, targets, cache[:, :, :self.width].index_select(0, sources))
        self.lengths.index_copy_(0, targets, self.lengths.index_select(0, sources))

    def swap_rows(self, a: int, b: int) -> None:
        """Exchange slots `a` and `b`: their keys, values (the columns either holds) and lengths."""
        held = int(self.lengths[[a, b]].max())
        for layer in self.layers:
            if layer.is_initialized and held:
                for cache in (layer.keys, layer.values):
                    # Three slice copies: ~20x faster on a CPU than one assignment indexed by [a, b].
                    kept = cache[a, :, :held].clone()
                    cache[a, :, :held] = cache[b, :, :held]
                    cache[b, :, :held] = kept
        self.lengths[[a, b]] = self.lengths[[b, a]]

    def advance(self, counts: torch.Tensor) -> None:
        """Add the real new tokens of the last `step`'s rows ((b,): the `batch` leading slots), or
        (N,) with its `rows`."""
        counts = counts.to(self.lengths.device)
        if self.rows is None:
            self.lengths[:self.batch].add_(counts)
        else:
            self.lengths.index_add_(0, self.rows, counts)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width

    def reset(self) -> None:
        self.lengths.zero_()
