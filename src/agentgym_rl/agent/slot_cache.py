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
forward (right-padded: a row's pads come after its real tokens and are overwritten later).
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
        """Write (B, H, Q, D) new keys and values at columns lengths[b] .. lengths[b] + Q - 1 of
        each row; returns the whole (B, H, L, D) cache, which the step's mask reads."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        columns = self.slots.write_columns(key_states.shape[2])[:, None, :, None]  # (B, 1, Q, 1)
        for cache, new in ((self.keys, key_states), (self.values, value_states)):
            cache.scatter_(2, columns.expand(-1, new.shape[1], -1, new.shape[-1]), new.to(cache.dtype))
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.slots.max_len, 0

    def get_seq_length(self) -> int:
        return self.slots.max_len

    def get_max_length(self) -> int:
        return self.slots.max_len


class SlotCache(Cache):
    """`size` rows of `max_len` columns for a model of `num_layers` layers.

    Attributes:
        lengths: (B,) int64, the tokens each row holds (on `device`).
    A forward over it takes `step(ids_width)`'s position ids and mask; then `advance(counts)`
    adds each row's real new tokens to its length.
    """

    def __init__(self, num_layers: int, size: int, max_len: int, device: Any = None):
        self.size, self.max_len = size, max_len
        self.lengths = torch.zeros(size, dtype=torch.long, device=device)
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    def write_columns(self, queries: int) -> torch.Tensor:
        """(B, Q) the columns a forward of Q new tokens a row writes (clamped into the slot: a row
        that has no room left writes its pads over its last column, which its mask never shows)."""
        offsets = torch.arange(queries, device=self.lengths.device)
        return (self.lengths[:, None] + offsets[None, :]).clamp_(max=self.max_len - 1)

    def step(self, queries: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(position ids (B, Q), boolean mask (B, 1, Q, L)) of a forward of Q new tokens a row:
        new token q of row b sits at position lengths[b] + q and sees columns 0 .. lengths[b] + q."""
        positions = self.write_columns(queries)
        columns = torch.arange(self.max_len, device=self.lengths.device)
        mask = columns[None, None, None, :] <= positions[:, None, :, None]
        return positions, mask

    def advance(self, counts: torch.Tensor) -> None:
        """Add (B,) real new tokens to each row's length (its pads are not kept)."""
        self.lengths.add_(counts.to(self.lengths.device))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.max_len

    def reset(self) -> None:
        self.lengths.zero_()
