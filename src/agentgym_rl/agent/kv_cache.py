"""A KV cache that appends in place.

transformers' `DynamicLayer` appends each decoding step's keys and values with `torch.cat`,
copying the whole cache every step. With long multi-turn prompts and short replies that copy
dominated generation on a CPU (5.3 of 17.4 s of a BabyAI rollout step). `AppendLayer` keeps its
keys and values in a buffer with room to spare and writes each step into it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

SPARE_COLUMNS = 64
"""Columns allocated beyond what is needed when a buffer is (re)allocated: one allocation
serves that many decoding steps."""


def _append(buffer: torch.Tensor | None, current: torch.Tensor, new: torch.Tensor,
            spare: int = SPARE_COLUMNS) -> tuple[torch.Tensor, torch.Tensor]:
    """Append `new` (B, H, S, D) to `current` (B, H, L, D) along dim 2.

    Writes into `buffer` when `current` is its first L columns and it has room for S more;
    otherwise allocates a new buffer of L + S + `spare` columns.
    Returns:
        (buffer, the first L + S columns of it: a view)
    """
    length = current.shape[-2] if current.dim() == 4 else 0
    needed = length + new.shape[-2]
    in_buffer = (buffer is not None and length > 0 and current.data_ptr() == buffer.data_ptr()
                 and current.shape[:2] == buffer.shape[:2] and needed <= buffer.shape[-2])
    if not in_buffer:
        shape = (*new.shape[:2], needed + spare, new.shape[-1])
        buffer = torch.empty(shape, dtype=new.dtype, device=new.device)
        if length:
            buffer[:, :, :length] = current
    buffer[:, :, length:needed] = new
    return buffer, buffer[:, :, :needed]


class AppendLayer(DynamicLayer):
    """A full-attention `DynamicLayer` whose `keys`/`values` are views of growing buffers.

    Everything else (`get_seq_length`, `batch_select_indices`, cropping) works on the views as
    on `DynamicLayer`'s tensors; a method that replaces them with fresh tensors just makes the
    next `update` allocate a new buffer.

    `next_spare`: the spare columns of a buffer the next `update` allocates (back to
    SPARE_COLUMNS after it), raised by a caller that knows more columns follow (a prefill split
    in two passes).
    """

    next_spare = SPARE_COLUMNS

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._key_buffer, self.keys = _append(self._key_buffer, self.keys, key_states, self.next_spare)
        self._value_buffer, self.values = _append(self._value_buffer, self.values, value_states, self.next_spare)
        self.next_spare = SPARE_COLUMNS
        return self.keys, self.values


def select_columns(cache: DynamicCache, rows: torch.Tensor, columns: torch.Tensor, spare: int = SPARE_COLUMNS) -> None:
    """Keep, in place, the cache's `rows` and in each of them the given `columns`, in order.

    out[b, :, j] = cache[rows[b], :, columns[b, j]]: a continued batch's rows re-packed so that
    the columns no row attends to (middle padding, finished episodes, pads after a stop token)
    are dropped. Keys hold their rotary position already, so moving a column changes nothing
    the attention sees as long as the caller's mask moves with it. Each layer is written into
    a new buffer with `spare` columns of room and its old buffer released before the next layer
    (selecting rows with `batch_select_indices` would hold the old and new cache together until
    the next `update`).

    Args:
        cache: a `DynamicCache` whose layers are all `DynamicLayer`s or `AppendLayer`s.
        rows: (B,) the kept row of each new row.
        columns: (B, L) the kept column of each new column.
    """
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys.dim() != 4:
            continue
        for name in ("keys", "values"):
            old = getattr(layer, name)
            heads, dim = old.shape[1], old.shape[3]
            room = spare if isinstance(layer, AppendLayer) else 0
            buffer = old.new_empty((len(rows), heads, columns.shape[1] + room, dim))
            # Advanced indices on dims 0 and 2 with a slice between them put the index dims first.
            buffer[:, :, :columns.shape[1]] = old[rows[:, None], :, columns].permute(0, 2, 1, 3)
            setattr(layer, name, buffer[:, :, :columns.shape[1]])
            if isinstance(layer, AppendLayer):
                setattr(layer, "_key_buffer" if name == "keys" else "_value_buffer", buffer)
            del old


def appending_cache(config: Any) -> DynamicCache:
    """An empty `DynamicCache` for a model with `config`, its full-attention layers `AppendLayer`s
    (sliding-window and other layer kinds are left as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [AppendLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def bytes_per_token(model: Any) -> int:
    """Bytes of keys and values one token adds to a full-attention cache of `model` (every
    layer's K and V, in the parameters' dtype): SmolLM2-135M-Instruct's is 46,080 in float32,
    the tiny model's 4,096."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element
