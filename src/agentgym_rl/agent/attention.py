"""Grouped-query attention on the CPU without copying keys and values.

transformers' "sdpa" attention repeats each key/value head for all the query heads that share it
(`repeat_kv`) whenever an attention mask is given, because CUDA's fast kernels take grouped heads
only without one. Our batches are left-padded, so every prefill and decoding step has a mask, and
on the CPU that copy was most of generation's time with SmolLM2 (9 query heads over 3 key/value
heads): one decoding step's attention over 11 rows × 3,000 cached tokens took 132 ms a layer with
the copy and 10–18 ms without it, the outputs identical (2026-11-27, 2 busy cores; its benchmark is
in docs/BENCHMARKS.md). torch's CPU SDPA takes grouped heads with a mask (`enable_gqa`), so
`use_grouped_attention` points a model at the same attention that passes them through.

On a GPU the same copy is made for every decoding step, and the memory-efficient kernel then
reads every copied head: an H200 profile of SmolLM2 decoding 128 rows over ~2,500 cached tokens
(docs/BENCHMARKS.md, 2026-11-29) spent 83% of a step on work that grows with the context. A
decoding step has one query a row, so `grouped_decode_attention` stacks the query heads that
share a key/value head as that head's queries: one SDPA call that reads each cached key and value
once and copies nothing.
"""

from __future__ import annotations

from typing import Any

NAME = "sdpa_grouped_cpu"
"""The attention implementation `use_grouped_attention` registers and sets."""


def grouped_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                 scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' SDPA attention, with grouped key/value heads passed through on the CPU and a
    GPU's masked decoding step done by `grouped_decode_attention`.

    Args:
        query: (B, H, Q, D); key, value: (B, K, L, D) with H a multiple of K.
        attention_mask: (B, 1, Q, L) as transformers' SDPA mask function makes it, or None.
    Returns:
        ((B, Q, H, D) attention output, None), as every transformers attention function.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get("prefix_tree") is not None:
        return tree_attention(query, key, value, kwargs["prefix_tree"], scaling, dropout), None
    grouped = key.shape[1] != query.shape[1]
    # Without a mask transformers passes grouped heads to SDPA uncopied; with one it copies them.
    if attention_mask is not None and grouped and kwargs.get("position_bias") is None:
        if decodes_stacked(query, dropout):
            return grouped_decode_attention(query, key, value, attention_mask, scaling), None
        if query.device.type == "cpu":
            output = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
            return output.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def decodes_stacked(query: Any, dropout: float) -> bool:
    """Whether a masked call over grouped heads goes to `grouped_decode_attention`: a decoding
    step (one query a row) off the CPU. On the CPU torch's grouped SDPA is as fast
    (docs/BENCHMARKS.md, 2026-11-29); a prefill's many queries suit SDPA's kernels as they are."""
    return query.device.type != "cpu" and query.shape[2] == 1 and dropout == 0.0


def grouped_decode_attention(query: Any, key: Any, value: Any, attention_mask: Any,
                             scaling: float | None = None) -> Any:
    """Masked attention of a few queries a row over grouped key/value heads, as one SDPA call in
    which the query heads that share a key/value head are stacked as that head's queries: each
    cached key and value is read once and none is copied, and the scores and their softmax are
    SDPA's own (kept in float32 inside its kernels for a bfloat16 model).

    Meant for a decoding step (Q = 1), where a kernel made for many queries would otherwise get
    one: stacked, it gets H / K of them.
    Args:
        query: (B, H, Q, D); key, value: (B, K, L, D), H a multiple of K; query head h attends
            with key/value head h // (H / K), as transformers' `repeat_kv` pairs them.
        attention_mask: (B, 1, Q, ≥L), boolean (True attends) or additive; its first L columns
            are the keys'.
    Returns:
        (B, Q, H, D) attention output.
    """
    import torch

    batch, heads, queries, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if attention_mask.shape[-1] < length:
        raise ValueError(f"an attention mask of {attention_mask.shape[-1]} columns for {length} keys")
    group = heads // kv_heads
    stacked = query.reshape(batch, kv_heads, group * queries, dim)
    # Each of the G stacked heads has the row's Q mask rows: (B, 1, G * Q, L), a view for Q = 1.
    mask = attention_mask[..., :length].unsqueeze(2).expand(-1, -1, group, -1, -1)
    mask = mask.reshape(mask.shape[0], 1, group * queries, length)
    output = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
    # reshape, not view: a CUDA kernel may hand back another memory layout (seen on an H200).
    return output.reshape(batch, heads, queries, dim).transpose(1, 2).contiguous()


def tree_attention(query: Any, key: Any, value: Any, trees: Any, scaling: float | None = None,
                   dropout: float = 0.0) -> Any:
    """Attention over tree rows (`train.prefix_sharing`): in each row a shared prefix attends
    causally to itself, and every suffix to the whole prefix and causally to itself, never to
    another suffix, as if each suffix followed the prefix in a row of its own.

    Args:
        query: (U, H, W, D); key, value: (U, K, W, D) with H a multiple of K.
        trees: U `TreeRow`s (their `prefix` and `suffixes` spans; positions past the last span
            are padding and get zeros).
    Returns:
        (U, W, H, D) attention output.
    """
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    grouped = key.shape[1] != query.shape[1]
    width = query.shape[2]
    rows = []
    for u, tree in enumerate(trees):
        q, k, v = query[u:u + 1], key[u:u + 1], value[u:u + 1]
        p = tree.prefix
        pieces = []
        if p:
            pieces.append(sdpa(q[:, :, :p], k[:, :, :p], v[:, :, :p], is_causal=True, dropout_p=dropout,
                               scale=scaling, enable_gqa=grouped))
        for start, end in tree.suffixes:
            keys = torch.cat([k[:, :, :p], k[:, :, start:end]], 2) if p else k[:, :, start:end]
            values = torch.cat([v[:, :, :p], v[:, :, start:end]], 2) if p else v[:, :, start:end]
            # Query i of the suffix sees the prefix and suffix keys up to its own: j <= p + i.
            mask = torch.ones(end - start, p + end - start, dtype=torch.bool, device=q.device).tril(p) if p else None
            pieces.append(sdpa(q[:, :, start:end], keys, values, attn_mask=mask, is_causal=not p,
                               dropout_p=dropout, scale=scaling, enable_gqa=grouped))
        used = tree.suffixes[-1][1] if tree.suffixes else p
        if used < width:
            pieces.append(q.new_zeros((1, q.shape[1], width - used, value.shape[-1])))
        rows.append(torch.cat(pieces, 2))
    return torch.cat(rows, 0).transpose(1, 2).contiguous()


def register_grouped_attention() -> None:
    """Make `NAME` known to transformers in this process. A model's config carries the name, so a
    process that builds a model from another's config (a Ray rollout worker) registers it first."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_grouped_attention(model: Any) -> None:
    """Make a model that attends with "sdpa" use `grouped_sdpa` (same results, no key/value copy on
    the CPU); other implementations (eager, flash, a LoRA wrapper's base set otherwise) are left.
    Saved checkpoints do not record the choice: their config.json has no attention implementation."""
    base = getattr(model, "get_base_model", lambda: model)()
    if getattr(getattr(base, "config", None), "_attn_implementation", None) != "sdpa":
        return
    register_grouped_attention()
    base.set_attn_implementation(NAME)
