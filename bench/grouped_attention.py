"""Grouped-query attention under a padding mask on the CPU: transformers' "sdpa" (which copies
each key/value head for its query heads, `repeat_kv`) against `agent/attention.py` (torch SDPA's
`enable_gqa`), one layer's attention and a whole generation of SmolLM2-135M-Instruct.

Run by hand (`make bench`); its tables go into docs/BENCHMARKS.md with the date and machine.

    python bench/grouped_attention.py [--reps 5] [--rows 11] [--context 3000]

1. One attention call of SmolLM2's shape (9 query heads over 3 key/value heads, head size 64)
   over `--rows` rows of `--context` cached tokens with a left-padding mask: a decoding step
   (1 query) and a prefill of an observation (150 queries), medians of `--reps` interleaved runs.
2. `HFGenerator` on SmolLM2: `--rows` prompts of about `--context` tokens (random ids, left
   padding of varied width), 16 new tokens greedily, with the model's attention set to each in
   turn; the ids must be equal.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F


def median_ms(function, reps: int, calls: int) -> list[float]:
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        for _ in range(calls):
            function()
        times.append(1000 * (time.perf_counter() - began) / calls)
    return times


def one_layer(rows: int, context: int, reps: int) -> list[str]:
    torch.manual_seed(0)
    heads, kv_heads, size = 9, 3, 64
    key, value = torch.randn(rows, kv_heads, context, size), torch.randn(rows, kv_heads, context, size)
    starts = torch.randint(0, context // 3, (rows,))
    table = []
    for queries in (1, 150):
        query = torch.randn(rows, heads, queries, size)
        mask = (torch.arange(context)[None, :] >= starts[:, None])[:, None, None, :].expand(rows, 1, queries, context)

        def copied():
            repeat = heads // kv_heads
            k = key[:, :, None].expand(rows, kv_heads, repeat, context, size).reshape(rows, heads, context, size)
            v = value[:, :, None].expand(rows, kv_heads, repeat, context, size).reshape(rows, heads, context, size)
            return F.scaled_dot_product_attention(query, k, v, attn_mask=mask)

        def grouped():
            return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)

        assert torch.allclose(copied(), grouped(), atol=1e-5)
        calls = 10 if queries == 1 else 2
        a, b = [], []
        for _ in range(reps):  # interleaved
            a += median_ms(copied, 1, calls)
            b += median_ms(grouped, 1, calls)
        ratio = [x / y for x, y in zip(a, b)]
        step = "decoding step" if queries == 1 else f"prefill of {queries} tokens"
        table.append(f"| {step} | {statistics.median(a):.1f} ms | {statistics.median(b):.1f} ms | "
                     f"{statistics.median(ratio):.1f}× ({min(ratio):.1f}–{max(ratio):.1f}) |")
    return table


def generation(rows: int, context: int, reps: int) -> list[str]:
    from agentgym_rl.agent.attention import NAME
    from agentgym_rl.agent.generator import HFGenerator
    from agentgym_rl.agent.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    generator = HFGenerator(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], 0.0, reuse_cache=False)
    torch.manual_seed(0)
    prompts = [torch.randint(100, 40000, (context - int(torch.randint(0, context // 3, ()).item()),)).tolist()
               for _ in range(rows)]
    seconds: dict[str, list[float]] = {"sdpa": [], NAME: []}
    ids: dict[str, list] = {}
    for _ in range(reps):
        for implementation in seconds:
            model.set_attn_implementation(implementation)
            began = time.perf_counter()
            generations = generator.generate(prompts, 16)
            seconds[implementation].append(time.perf_counter() - began)
            ids[implementation] = [g.ids for g in generations]
    assert ids["sdpa"] == ids[NAME], "the two attentions generated different ids"
    ratio = [a / b for a, b in zip(seconds["sdpa"], seconds[NAME])]
    return [f"| SmolLM2, {rows} prompts of ≤ {context} tokens, 16 new tokens | {statistics.median(seconds['sdpa']):.1f} s "
            f"| {statistics.median(seconds[NAME]):.1f} s | {statistics.median(ratio):.2f}× "
            f"({min(ratio):.2f}–{max(ratio):.2f}) |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=11)
    parser.add_argument("--context", type=int, default=3000)
    args = parser.parse_args()
    rows = one_layer(args.rows, args.context, args.reps)
    rows += generation(args.rows, args.context, max(1, args.reps // 2))
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median (min–max) of interleaved repetitions")
    print("| work | transformers' sdpa (heads copied) | grouped (`agent/attention.py`) | speed-up |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
