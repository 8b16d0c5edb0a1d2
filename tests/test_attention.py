"""The attention `use_grouped_attention` gives a model: a GPU's decoding step as one SDPA call
over the grouped heads, their query heads stacked (`grouped_decode_attention`), checked by hand
and against SDPA over copied heads, and which path each call takes."""

from __future__ import annotations

import math

import pytest
import torch
import transformers.integrations.sdpa_attention as transformers_sdpa

import agentgym_rl.agent.attention as attention
from agentgym_rl.agent.attention import grouped_decode_attention, grouped_sdpa


def test_one_key_value_head_shared_by_two_query_heads_by_hand():
    """B=1, K=1, H=2, D=1, scale 1: keys 0 and ln 3, values 0 and 4. The query 1 weighs the keys
    1/4 and 3/4 (output 3), the query -1 weighs them 3/4 and 1/4 (output 1); with the first key
    masked both see only the second value, 4."""
    query = torch.tensor([1.0, -1.0]).view(1, 2, 1, 1)
    key = torch.tensor([0.0, math.log(3)]).view(1, 1, 2, 1)
    value = torch.tensor([0.0, 4.0]).view(1, 1, 2, 1)
    both = torch.ones(1, 1, 1, 2, dtype=torch.bool)
    out = grouped_decode_attention(query, key, value, both, scaling=1.0)
    assert out.shape == (1, 1, 2, 1)  # (B, Q, H, D)
    assert out.flatten().tolist() == pytest.approx([3.0, 1.0], abs=1e-6)
    second_only = torch.tensor([[[[False, True]]]])
    assert grouped_decode_attention(query, key, value, second_only, scaling=1.0).flatten().tolist() == \
        pytest.approx([4.0, 4.0])


def _left_padded_mask(batch: int, queries: int, length: int, padding: list[int]) -> torch.Tensor:
    """(B, 1, Q, L) boolean: row b skips its first padding[b] columns and is causal over the last Q."""
    mask = torch.ones(batch, 1, queries, length, dtype=torch.bool)
    for row, pad in enumerate(padding):
        mask[row, :, :, :pad] = False
    for q in range(queries):  # query q sees the columns up to its own, L - Q + q
        mask[:, :, q, length - queries + q + 1:] = False
    return mask


@pytest.mark.parametrize("queries", [1, 3])
def test_stacked_heads_equal_sdpa_over_copied_heads(queries):
    """Three key/value heads each shared by three query heads (SmolLM2's grouping), left-padded
    rows, a boolean mask, an additive one, and a mask wider than the cache: the same output as
    SDPA given every key/value head copied for its query heads (transformers' `repeat_kv`).
    Three queries a row check that heads and queries are stacked and unstacked in order."""
    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 3, 9, 3, 11, 8
    query = torch.randn(batch, heads, queries, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = _left_padded_mask(batch, queries, length, padding=[2, 0, 5])
    copied_key = transformers_sdpa.repeat_kv(key, heads // kv_heads)
    copied_value = transformers_sdpa.repeat_kv(value, heads // kv_heads)
    for scaling in (None, 0.3):
        expected = torch.nn.functional.scaled_dot_product_attention(
            query, copied_key, copied_value, attn_mask=mask, scale=scaling).transpose(1, 2)
        additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        wider = torch.cat([mask, torch.zeros(batch, 1, queries, 4, dtype=torch.bool)], dim=-1)
        for given in (mask, additive, wider):
            out = grouped_decode_attention(query, key, value, given, scaling)
            torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_an_sdpa_output_in_another_memory_layout_gives_the_same_attention(monkeypatch):
    """SDPA's CUDA kernels may return their (B, K, G * Q, D) output in another layout (on an
    H200 `.view` of it failed); the CPU's is contiguous, so a kernel that returns it transposed in
    memory stands in for them here."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 9, 1, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    expected = grouped_decode_attention(query, key, value, mask)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def other_layout(*args, **kwargs):
        output = sdpa(*args, **kwargs)
        return output.transpose(1, 2).contiguous().transpose(1, 2)  # same values, heads innermost in memory

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", other_layout)
    assert not other_layout(query.reshape(2, 3, 3, 8), key, value).is_contiguous()
    torch.testing.assert_close(grouped_decode_attention(query, key, value, mask), expected)


def test_bfloat16_is_as_close_to_exact_as_sdpa_over_copied_heads():
    """A bfloat16 model: against attention in float64, the stacked call errs no more than SDPA
    over copied heads (its scores and softmax stay in float32 inside the kernel; rounding the
    scores to bfloat16 before the softmax, as a plain matrix product would, errs 2.2× as much)."""
    torch.manual_seed(1)
    batch, heads, kv_heads, length, dim = 8, 9, 3, 1000, 64
    query = 3 * torch.randn(batch, heads, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = _left_padded_mask(batch, 1, length, padding=[0, 10, 100, 300, 0, 5, 700, 1])
    exact = torch.nn.functional.scaled_dot_product_attention(
        query.double(), transformers_sdpa.repeat_kv(key, 3).double(), transformers_sdpa.repeat_kv(value, 3).double(),
        attn_mask=mask).transpose(1, 2)
    half = [t.bfloat16() for t in (query, key, value)]
    ours = grouped_decode_attention(*half, mask)
    assert ours.dtype == torch.bfloat16
    copied = torch.nn.functional.scaled_dot_product_attention(
        half[0], transformers_sdpa.repeat_kv(half[1], 3), transformers_sdpa.repeat_kv(half[2], 3),
        attn_mask=mask).transpose(1, 2)
    error = (ours.double() - exact).abs().mean()
    assert error <= 1.2 * (copied.double() - exact).abs().mean()


def test_a_mask_narrower_than_the_keys_is_refused():
    query, key = torch.randn(1, 2, 1, 4), torch.randn(1, 1, 5, 4)
    with pytest.raises(ValueError, match="4 columns for 5 keys"):
        grouped_decode_attention(query, key, key, torch.ones(1, 1, 1, 4, dtype=torch.bool))


def test_which_path_a_call_takes(monkeypatch):
    """On a GPU (here the meta device, which has no values) a masked single-query step over
    grouped heads goes to the stacked call (`decodes_stacked`), anything else to transformers'
    SDPA or, for tree rows, to `tree_attention`; on the CPU the masked step stays with torch's
    grouped SDPA, which was as fast there (docs/BENCHMARKS.md)."""
    taken = []
    monkeypatch.setattr(attention, "grouped_decode_attention", lambda *a, **k: taken.append("stacked"))
    monkeypatch.setattr(attention, "tree_attention", lambda *a, **k: taken.append("tree"))
    monkeypatch.setattr(transformers_sdpa, "sdpa_attention_forward",
                        lambda *a, **k: taken.append("transformers") or (None, None))

    def call(device, queries=1, mask=True, kv_heads=3, dropout=0.0, **kwargs):
        query = torch.empty(2, 9, queries, 8, device=device)
        key = value = torch.empty(2, kv_heads, 12, 8, device=device)
        given = torch.ones(2, 1, queries, 12, dtype=torch.bool, device=device) if mask else None
        taken.clear()
        grouped_sdpa(None, query, key, value, given, dropout=dropout, **kwargs)
        return taken[0] if taken else "torch sdpa"

    assert call("meta") == "stacked"
    assert call("meta", queries=5) == "transformers"  # a prefill: SDPA's kernels for many queries
    assert call("meta", mask=False) == "transformers"  # no mask: transformers passes the heads through
    assert call("meta", kv_heads=9) == "transformers"  # no grouping
    assert call("meta", dropout=0.1) == "transformers"
    assert call("meta", position_bias=torch.empty(1, device="meta")) == "transformers"
    assert call("meta", prefix_tree=[object()]) == "tree"
    assert call("cpu") == "torch sdpa"
