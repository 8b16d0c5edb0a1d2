"""Where a decoding step of `HFGenerator` goes, on the CPU or `--device cuda`: the model's own
forward pass against `generate`'s whole step (transformers' loop, our cache and logits
processors), greedy and sampled from per-episode streams, and the cost of starting a turn.

Run by hand (`make bench` does not: it is for a lent GPU, one short call); its table goes into
docs/BENCHMARKS.md with the date and machine. The model has SmolLM2-135M-Instruct's shape
(`SMOLLM2`: 30 layers, 9 query heads over 3 key/value heads, 49,152 tokens) with random weights,
so no model file has to travel: a step's time does not depend on the weights, and replies run to
`--new-tokens` (a random model almost never writes the stop id), as the longest reply of a
rollout's turn does.

    python bench/decode_step.py [--device cuda] [--rows 32 128] [--context 1000 2500] [--new-tokens 48]
                                [--reps 3] [--attention grouped sdpa] [--generator hf slots graphs]
                                [--dtype float32] [--slot-len 8192] [--slots 32] [--stop-share 0.05]
                                [--temperature 0.8] [--profile] [--check-graphs]

Per (rows, context): prompts of about `context` random ids (lengths spread ±10%, so left padding
as in a rollout), in groups of `--group` equal prompts (a GRPO step's first turn), all sharing
their first `--shared` ids (system prompt and worked example). Columns, in ms, medians of `--reps`:
- forward: one decoding step of the model alone (one new column over the cached ones, the mask
  `generate` would pass), in a loop of `--new-tokens` steps feeding back the argmax;
- greedy / sampled step: (time of `generate` for N tokens - time for 1 token) / (N - 1), i.e.
  each step after the prefill; sampled = `--temperature` (0.8) with one random stream per row;
- prefill: `generate` of 1 token (the first turn's prompts, repeats run once);
- next turn: `generate` of 1 token for each prompt extended by its reply and `--observation`
  new ids (the rollout's next turn: cache matched, re-packed, the new ids prefilled);
- floor: the least a decoding step can take, reading the weights and each row's `context` cached keys and
  values once at the bandwidth this device copies with (measured at the start: `bandwidth`).
`--attention` names the attention each row of the table runs: `grouped`, the generator's own
(`agent/attention.py`; on a GPU a decoding step by `grouped_decode_attention`), and `sdpa`,
transformers' own, which copies the grouped key/value heads under a mask (what a GPU ran before
2026-11-29): both in one run give their ratio. `--generator` names the generators compared: `hf`
(`HFGenerator`), `slots` (`SlotGenerator`, each row in a slot of its own, eager; the forward
column is the same model step either way) and `graphs` (`SlotGenerator` replaying each decoding
step as a captured CUDA graph; eager on the CPU). `--check-graphs` first compares `graphs` with
`slots` on the same prompts (ids equal, logprobs within `GRAPH_LOGPROB_TOL`). `--slot-len` gives
the slots `rollout.max_context` tokens, as the backend does (attention then reads the context
bucket the prompts need, `slot_generator.context_width`), instead of just what they need.
`--slots` gives the slot generator more slots than a call has rows (a rollout's last turns, when
fewer episodes are left than `rollout.max_envs`): it then decodes the call's batch bucket.
`--stop-share F` makes that share of the vocabulary end a reply, so that sampled replies stop at
spread lengths (about 1/F tokens, a few running to `--new-tokens`), as a rollout's do: the step
columns are then a whole call's time over its steps, in which `HFGenerator` decodes every row to
the longest reply and `SlotGenerator` moves the rows still replying into smaller batch buckets.
`--profile` adds torch.profiler's table of the ops that took the most time over one sampled
`generate` of 8 tokens at the largest size: on a GPU, whether the step waits for the GPU or for
Python.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
               rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
               eos_token_id=2, pad_token_id=2)
"""SmolLM2-135M-Instruct's config.json, as `agentgym-rl models prepare` converts it, less its name."""

PAD, STOP = 2, 2


def stop_ids(share: float) -> tuple[int, ...]:
    """The ids that end a reply: `STOP`, and with `share` > 0 that share of the vocabulary."""
    return (STOP, *range(3, 3 + int(share * SMOLLM2["vocab_size"])))


def build_model(device: torch.device, dtype: str = "float32") -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2, attn_implementation="sdpa"))
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def prompts_for(rows: int, context: int, group: int, shared: int, seed: int) -> list[list[int]]:
    """`rows` prompts of `context` ± 10% random ids: groups of `group` equal ones, all sharing
    their first `shared` ids."""
    generator = torch.Generator().manual_seed(seed)
    common = torch.randint(3, SMOLLM2["vocab_size"], (shared,), generator=generator).tolist()
    prompts = []
    for _ in range(0, rows, group):
        length = context + int(torch.randint(-context // 10, context // 10 + 1, (1,), generator=generator))
        rest = torch.randint(3, SMOLLM2["vocab_size"], (max(1, length - shared),), generator=generator).tolist()
        prompts += [common + rest] * group
    return prompts[:rows]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of `model`'s parameters, a tied embedding and output head counted once (one matrix)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def floor_ms(weights: int, token_bytes: int, rows: int, cached: int, bandwidth: float) -> float:
    """Milliseconds a decoding step takes at least: `weights` bytes and `rows` x `cached` tokens of
    `token_bytes` keys and values each, read once at `bandwidth` bytes a second."""
    return 1000 * (weights + rows * cached * token_bytes) / bandwidth


def bandwidth(device: torch.device, megabytes: int = 1024, reps: int = 5) -> float:
    """Bytes a second `device` moves in a copy of `megabytes` (read and written, both counted),
    the best of `reps`."""
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    best = min(timed(lambda: target.copy_(source), device) for _ in range(reps))
    return 2 * source.numel() / best


def timed(function, device: torch.device) -> float:
    """Seconds `function()` took, its queued GPU work included."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    began = time.perf_counter()
    function()
    synchronize()
    return time.perf_counter() - began


def forward_steps(model, prompts: list[list[int]], steps: int, device: torch.device) -> float:
    """Seconds a step of the model alone: a prefill into an appending cache, then `steps` single
    columns with the growing mask, each the argmax of the last (not timed: the prefill)."""
    from agentgym_rl.agent.kv_cache import appending_cache

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache = appending_cache(model.config)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        state = {"next": out.logits[:, -1].argmax(-1, keepdim=True), "mask": mask}

        def loop() -> None:
            for _ in range(steps):
                state["mask"] = torch.cat([state["mask"], state["mask"].new_ones((len(prompts), 1))], dim=1)
                positions = state["mask"].sum(-1, keepdim=True) - 1
                step = model(input_ids=state["next"], attention_mask=state["mask"], position_ids=positions,
                             past_key_values=cache, use_cache=True)
                state["next"] = step.logits[:, -1].argmax(-1, keepdim=True)

        return timed(loop, device) / steps


def attend_with(model, attention: str) -> None:
    """`grouped`: the attention the generator sets; `sdpa`: transformers' own."""
    from agentgym_rl.agent.attention import use_grouped_attention

    if attention == "grouped":
        use_grouped_attention(model)
    else:
        model.set_attn_implementation("sdpa")


def generator_for(model, temperature: float, attention: str = "grouped", kind: str = "hf", rows: int = 0,
                  max_len: int = 0, slots: int = 0, stops: tuple[int, ...] = (STOP,)):
    from agentgym_rl.agent.generator import HFGenerator
    from agentgym_rl.agent.slot_generator import SlotGenerator

    if kind in ("slots", "graphs"):  # eager, or each decoding step replayed as a CUDA graph
        generator = SlotGenerator(model, PAD, list(stops), temperature, slots=max(slots, rows), max_len=max_len,
                                  cuda_graphs=kind == "graphs")
    else:
        generator = HFGenerator(model, pad_id=PAD, stop_ids=list(stops), temperature=temperature, batch_size=1024)
    attend_with(model, attention)  # after the generator, which sets the grouped attention
    return generator


def measure(model, rows: int, context: int, attention: str, kind: str, args, device: torch.device
            ) -> dict[str, float]:
    prompts = prompts_for(rows, context, args.group, args.shared, seed=rows * 100_003 + context)
    max_len = args.slot_len or max(map(len, prompts)) + 2 * args.new_tokens + args.observation
    streams = list(range(1, rows + 1))
    n = args.new_tokens
    result: dict[str, list[float]] = {name: [] for name in ("forward", "greedy", "sampled", "prefill", "turn",
                                                             "reply")}
    for _ in range(args.reps):
        attend_with(model, attention)
        result["forward"].append(forward_steps(model, prompts, n, device))
        for name, temperature in (("greedy", 0.0), ("sampled", args.temperature)):
            generator = generator_for(model, temperature, attention, kind, rows, max_len, args.slots,
                                      stop_ids(args.stop_share))
            kw = {} if temperature == 0 else {"streams": streams}
            if kind == "graphs":  # capture outside the timing, at the size the timed calls use
                generator.generate(prompts, n, **kw)
                generator.reset()
            elif kind == "slots":  # the slots are allocated whole at the first call: outside the timing
                generator.generate(prompts, 1, **kw)
                generator.reset()
            one = timed(lambda: generator.generate(prompts, 1, **kw), device)
            generator.reset()
            replies: list = []
            whole = timed(lambda: replies.extend(generator.generate(prompts, n, **kw)), device)
            result[name].append((whole - one) / (n - 1))
            if name == "sampled":
                result["reply"].append(statistics.mean(len(r.ids) for r in replies))
                result["prefill"].append(one)
                tail = torch.randint(3, SMOLLM2["vocab_size"], (args.observation,)).tolist()
                extended = [p + r.ids + tail for p, r in zip(prompts, replies)]
                result["turn"].append(timed(lambda: generator.generate(extended, 1, streams=streams), device))
            del generator
    return {name: statistics.median(values) for name, values in result.items()}


def check_graphs(model, rows: int, context: int, args) -> None:
    """The slot generator's replies decoded eagerly and as replayed CUDA graphs, for the same
    prompts and streams, greedy and sampled: the same ids, logprobs within `GRAPH_LOGPROB_TOL`.
    Exits 5 when they differ, or when no graph was captured on a CUDA device."""
    prompts = prompts_for(rows, context, args.group, args.shared, seed=7)
    max_len = max(map(len, prompts)) + args.new_tokens + 1
    for temperature in (0.0, args.temperature):
        kw = {} if temperature == 0 else {"streams": list(range(1, rows + 1))}
        eager, graphed = (generator_for(model, temperature, kind=kind, rows=rows, max_len=max_len,
                                        stops=stop_ids(args.stop_share)) for kind in ("slots", "graphs"))
        a, b = (g.generate(prompts, args.new_tokens, **kw) for g in (eager, graphed))
        same_ids = [x.ids for x in a] == [y.ids for y in b]
        gap = max((abs(p - q) for x, y in zip(a, b) for p, q in zip(x.logprobs, y.logprobs)), default=0.0)
        used = bool(graphed._graphs)
        print(f"# graphs against eager, temperature {temperature}: ids {'equal' if same_ids else 'DIFFER'}, "
              f"largest logprob gap {gap:.2e} (tolerance {GRAPH_LOGPROB_TOL:g}), graph {'replayed' if used else 'NOT captured'}",
              flush=True)
        if not same_ids or gap > GRAPH_LOGPROB_TOL or (model.device.type == "cuda" and not used):
            raise SystemExit(5)


GRAPH_LOGPROB_TOL = 1e-3
"""A graph replays the eager step's kernels: any gap is the order of reductions in bfloat16."""


def profile(model, rows: int, context: int, attention: str, args, device: torch.device) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    prompts = prompts_for(rows, context, args.group, args.shared, seed=1)
    generator = generator_for(model, args.temperature, attention)
    generator.generate(prompts, 2, streams=list(range(1, rows + 1)))  # kernels load outside the profile
    generator.reset()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        generator.generate(prompts, 8, streams=list(range(1, rows + 1)))
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"\n# torch.profiler, {attention} attention, one sampled generate of 8 tokens (prefill included), "
          f"{rows} rows of ~{context} ids, by {key}")
    print(prof.key_averages().table(sort_by=key, row_limit=15))
    if device.type == "cuda":  # what Python and the launches cost beside the GPU's own time
        print("# by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--context", type=int, nargs="+", default=[1000, 2500])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--group", type=int, default=8, help="equal prompts in a row (a GRPO group)")
    parser.add_argument("--shared", type=int, default=600, help="ids every prompt starts with")
    parser.add_argument("--observation", type=int, default=150, help="new ids of the next turn")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--attention", nargs="+", choices=["grouped", "sdpa"], default=["grouped"])
    parser.add_argument("--generator", nargs="+", choices=["hf", "slots", "graphs"], default=["hf"])
    parser.add_argument("--check-graphs", action="store_true",
                        help="first compare the slot generator's replies with CUDA graphs and without (exit 5 if they differ)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--slot-len", type=int, default=0,
                        help="tokens a slot holds (the backend gives rollout.max_context; 0: just what the prompts need)")
    parser.add_argument("--slots", type=int, default=0,
                        help="the slot generator's slots, when more than --rows (0: as many as the rows)")
    parser.add_argument("--temperature", type=float, default=0.8, help="the sampled columns' temperature")
    parser.add_argument("--stop-share", type=float, default=0.0,
                        help="share of the vocabulary that ends a reply (replies of spread lengths)")
    parser.add_argument("--profile", action="store_true", help="profile each --attention at the largest size")
    args = parser.parse_args()
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2: a step is timed as generate(N) - generate(1)")
    if not 0 <= args.stop_share < 1:
        parser.error("--stop-share must be at least 0 and below 1")
    if min(args.context) <= args.shared:
        parser.error(f"--context must exceed --shared ({args.shared})")
    if args.temperature <= 0:
        parser.error("--temperature must be above 0 (the greedy column is always measured)")
    device = torch.device(args.device)
    model = build_model(device, args.dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    print(f"# {name}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"SmolLM2-135M's shape, random weights, {args.dtype}, {args.new_tokens} new tokens; ms, median of "
          f"{args.reps}")
    from agentgym_rl.agent.kv_cache import bytes_per_token

    moved = bandwidth(device)
    weights, token_bytes = weight_bytes(model), bytes_per_token(model)
    print(f"# bandwidth: {moved / 1e9:.0f} GB/s (a 1 GiB copy, best of 5); weights {weights / 2**20:.0f} MiB, "
          f"{token_bytes:,} bytes of keys and values a cached token")
    if args.check_graphs:
        check_graphs(model, min(args.rows), min(args.context), args)
    print(f"| generator | attention | rows | context | forward step | greedy step | sampled step | prefill | "
          f"next turn ({args.observation} ids) | floor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rows in args.rows:
        for context in args.context:
            for kind in args.generator:
                for attention in args.attention:  # side by side, so that their ratio is of one moment
                    m = measure(model, rows, context, attention, kind, args, device)
                    print(f"| {kind} | {attention} | {rows} | {context} | {1000 * m['forward']:.1f} | "
                          f"{1000 * m['greedy']:.1f} | {1000 * m['sampled']:.1f} | {1000 * m['prefill']:.0f} | "
                          f"{1000 * m['turn']:.0f} | {floor_ms(weights, token_bytes, rows, context, moved):.2f} |",
                          flush=True)
                    if args.stop_share:
                        print(f"#   its sampled replies: {m['reply']:.1f} tokens on average", flush=True)
    if args.profile:
        for attention in args.attention:
            profile(model, max(args.rows), max(args.context), attention, args, device)


if __name__ == "__main__":
    main()
