"""Multi-turn rollout throughput side by side: ours against TRL's per-turn generation, on the
same environments, model, tasks and sampling, each figure a median of interleaved repetitions.

Run by hand (`make bench`); its tables go into docs/BENCHMARKS.md with the date and machine.

    python bench/rollout_vs_trl.py [--reps 5] [--quick] [--turns 8] [--only tiny-quiet] [--envs babyai]
        [--conditions quiet busy] [--models tiny larger]

Arms (every arm plays through our rollout engine, so only generation differs):
- ours: `HFGenerator` as a training run uses it (the previous turn's KV cache continued, its
  thread count chosen by timing).
- ours, 1 thread / 2 threads: the same with `rollout.threads` pinned.
- TRL 1.16: a real `GRPOTrainer` (the `bench` extra) generating through its own
  `_generate_single_turn`, the call its multi-turn path without vLLM (`_tool_call_loop`) makes
  every turn: the transformers branch left-pads every prompt in full and calls `model.generate`
  with the trainer's `GenerationConfig` (sampling at temperature 1, top_p 1.0, top_k 0, the end
  of turn as EOS), keeps each completion up to its first EOS and returns no logprobs. It is what
  a naive `generate` per turn does: the whole prefix is recomputed every turn.
- TRL 1.16, 1 thread: the same with torch pinned to one thread while it generates.

Conditions: a quiet machine at torch's default thread count, and a busy one (`--busy N`
processes spinning, 4 by default: load about 6 on 2 cores). Floor: one forward pass, without
gradients, over every final trajectory at once (each token is read once); generation's time
as a multiple of it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.generator import Generation, HFGenerator
from agentgym_rl.agent.tiny import TinyModelConfig, build_model, train_tokenizer
from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry, tasks
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import ModelPolicy
from agentgym_rl.train.demonstrations import collect_expert, conversation_text

LARGER = TinyModelConfig(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=8, intermediate_size=1536)


def trl_trainer(model, tokenizer, stop_ids: list[int], max_new_tokens: int = 12, micro_batch: int = 8,
                rows: int = 32):
    """A real TRL `GRPOTrainer` on the CPU around `model`: sampling at temperature 1 with top-p 1
    and top-k 0 (its defaults), `stop_ids` ending a completion, `max_new_tokens` per turn."""
    import tempfile

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", bf16=False,
                      per_device_train_batch_size=micro_batch, gradient_accumulation_steps=rows // micro_batch,
                      num_generations=4, learning_rate=1e-5, max_grad_norm=1.0, max_completion_length=max_new_tokens)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["unused"] * rows}), processing_class=tokenizer)
    trainer.eos_token_ids = list(stop_ids)
    trainer.generation_kwargs["eos_token_id"] = trainer.generation_config.eos_token_id = list(stop_ids)
    trainer.current_gradient_accumulation_steps = rows // micro_batch
    return trainer


class TRLGenerator:
    """TRL 1.16's own per-turn generation: `GRPOTrainer._generate_single_turn`, the call its
    multi-turn loop (`_tool_call_loop`) makes every turn without vLLM: every prompt left-padded in
    full, `model.generate`, each completion cut after its first stop id; no logprobs."""

    def __init__(self, trainer, threads: int = 0):
        self.trainer, self.threads = trainer, threads

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        outer = torch.get_num_threads()
        torch.set_num_threads(self.threads or outer)
        try:
            completions, _ = self.trainer._generate_single_turn(prompts, None, {}, 1)
        finally:
            torch.set_num_threads(outer)
        stop = set(self.trainer.eos_token_ids)
        return [Generation(ids, [0.0] * len(ids), bool(ids) and ids[-1] in stop) for ids in completions]

    def sync_weights(self, model) -> None:
        pass


def build(env_id: str, config: TinyModelConfig):
    demos = collect_expert(env_id, "train", 40)
    tokenizer = train_tokenizer(conversation_text(demos), config.vocab_size)
    return build_model(tokenizer, config).eval(), tokenizer


def play(arm: str, model, tokenizer, env_id: str, task_count: int, samples: int, turns: int, new_tokens: int):
    encoder = ChatEncoder(tokenizer)
    stop = [encoder.end_of_turn_id]
    if arm.startswith("TRL 1.16"):
        generator = TRLGenerator(trl_trainer(model, tokenizer, stop, new_tokens), threads=1 if "1 thread" in arm else 0)
    else:
        threads = {"ours": 0, "ours, 1 thread": 1, "ours, 2 threads": 2}[arm]
        generator = HFGenerator(model, tokenizer.pad_token_id, stop, 1.0, threads=threads)
    engine = RolloutEngine(registry.env_factory(env_id), RolloutConfig(max_new_tokens=new_tokens, max_context=8192))
    torch.manual_seed(0)
    began = time.perf_counter()
    with engine:
        trajectories = engine.run(tasks(env_id, "train")[:task_count], ModelPolicy(generator, encoder), turns, samples)
    seconds = time.perf_counter() - began
    generated = sum(sum(t.loss_mask) for t in trajectories)
    steps = sum(t.turns for t in trajectories)
    return seconds, generated, steps, trajectories, generator


def floor_seconds(model, trajectories, pad_id: int) -> float:
    """One no-grad forward pass over every final trajectory (right-padded, masked)."""
    rows = [t.input_ids for t in trajectories]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    began = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(rows), 8):
            model(input_ids=ids[start:start + 8], attention_mask=mask[start:start + 8])
    return time.perf_counter() - began


def work_ratio(trajectories) -> tuple[float, float]:
    """How much more TRL's per-turn recomputation runs through the model than our continued
    cache, counted from the episodes: (token columns, attention pairs), TRL's over ours.

    At turn t TRL runs every live row's whole prompt, left-padded to the longest, then its
    completion; ours runs the new tokens since the row's last reply, padded to the longest, then
    the completion, against the context kept so far (whose width grows by both every turn).
    Ours is counted padded to the longest row; our generator pads less (it runs leading padded
    columns only for the rows with tokens there), so the ratio is a lower bound: `measure` prints
    the columns it really prefilled."""
    replies = []  # per episode: (first, last) position of each generated reply
    for t in trajectories:
        mask = t.loss_mask
        starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
        ends = [i + 1 for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
        replies.append(list(zip(starts, ends)))
    trl_columns = trl_pairs = our_columns = our_pairs = kept = 0
    for turn in range(max(map(len, replies))):
        live = [(r[turn], r[turn - 1][1] if turn else 0) for r in replies if len(r) > turn]
        rows = len(live)
        prompt = max(start for (start, _), _ in live)
        new = max(start - previous for (start, _), previous in live)
        completion = max(end - start for (start, end), _ in live)
        trl_columns += rows * (prompt + completion)
        trl_pairs += rows * (prompt * prompt / 2 + completion * prompt)
        our_columns += rows * (new + completion)
        our_pairs += rows * (new * (kept + new / 2) + completion * (kept + new))
        kept += new + completion
    return trl_columns / our_columns, trl_pairs / our_pairs


def threads_chosen(generator) -> str:
    """The share of forward passes the thread chooser ran on each count ("" when it was pinned)."""
    passes = getattr(generator, "thread_passes", None)
    if not passes:
        return ""
    total = sum(passes.values())
    return ", passes on " + ", ".join(f"{count} thread(s) {n / total:.0%}" for count, n in sorted(passes.items()))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


def ratio_spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}× ({min(values):.2f}–{max(values):.2f})"


def measure(label: str, arms: list[str], model, tokenizer, env_id: str, reps: int, busy: int,
            workload: dict) -> list[str]:
    """Interleaved repetitions of every arm after a warm-up; one table row per arm."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        play(arms[0], model, tokenizer, env_id, **{**workload, "task_count": 2, "turns": 2})  # warm-up
        results: dict[str, list[tuple[float, int, int, float]]] = {arm: [] for arm in arms}
        for _ in range(reps):
            for arm in arms:
                seconds, generated, steps, trajectories, generator = play(arm, model, tokenizer, env_id, **workload)
                if arm == arms[0]:
                    kept_trajectories = trajectories
                    kept_prefilled = getattr(generator, "prefilled_columns", None)
                floor = floor_seconds(model, trajectories, tokenizer.pad_token_id)
                results[arm].append((seconds, generated, steps, floor))
                print(f"  {label} {arm}: {seconds:.1f} s, {generated / seconds:.0f} tokens/s"
                      f"{threads_chosen(generator)}", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
    columns, pairs = work_ratio(kept_trajectories)
    print(f"  {label}: TRL runs {columns:.2f}× our token columns and {pairs:.2f}× our attention pairs", flush=True)
    if kept_prefilled is not None:
        prompt_tokens = sum(len(t.input_ids) - sum(t.loss_mask) for t in kept_trajectories)
        print(f"  {label}: {arms[0]} prefilled {kept_prefilled} columns for {prompt_tokens} prompt tokens "
              f"({kept_prefilled / prompt_tokens:.2f}×)", flush=True)
    rows = []
    for arm in arms:
        runs = results[arm]
        tokens_per_s = [g / s for s, g, _, _ in runs]
        steps_per_s = [n / s for s, _, n, _ in runs]
        vs_trl = [(g / s) / (gt / st) for (s, g, _, _), (st, gt, _, _) in zip(runs, results["TRL 1.16"])]
        over_floor = [s / f for s, _, _, f in runs]
        rows.append(f"| {label} | {arm} | {spread(tokens_per_s)} | {spread(steps_per_s)} | "
                    f"{ratio_spread(vs_trl)} | {ratio_spread(over_floor)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--busy", type=int, default=4, help="spinning processes for the busy condition")
    parser.add_argument("--quick", action="store_true", help="tiny model on BabyAI only, 2 repetitions")
    parser.add_argument("--envs", nargs="*", default=["babyai", "textcraft"])
    parser.add_argument("--turns", type=int, default=8, help="turns per episode (BabyAI's test limit is 20)")
    parser.add_argument("--only", choices=["tiny-quiet"], help="only the tiny models on the quiet machine, "
                        "ours and TRL at the default thread count (e.g. for a long --turns)")
    parser.add_argument("--conditions", nargs="*", choices=["quiet", "busy"], default=["quiet", "busy"])
    parser.add_argument("--models", nargs="*", choices=["tiny", "larger"], default=["tiny", "larger"],
                        help="the tiny models (every env and condition) and the 27.5M one (BabyAI, quiet, ours "
                        "against TRL at the default count and at 1 thread)")
    args = parser.parse_args()
    workload = {"task_count": 8, "samples": 4, "turns": args.turns, "new_tokens": 12}
    arms = ["ours", "TRL 1.16"] if args.only else ["ours", "ours, 1 thread", "ours, 2 threads", "TRL 1.16",
                                                  "TRL 1.16, 1 thread"]
    named = {"quiet": ("quiet", 0), "busy": (f"busy ({args.busy} spinning)", args.busy)}
    conditions = [named["quiet"]] if args.only else [named[c] for c in args.conditions]
    header = ["| env, model, machine | generation | generated tokens/s | env steps/s | vs TRL 1.16 (within rep) | "
              "time / forward-only floor |", "|---|---|---|---|---|---|"]
    rows = []
    envs = ["babyai"] if args.quick else args.envs
    reps = 2 if args.quick else args.reps
    for env_id in envs if "tiny" in args.models or args.quick else []:
        model, tokenizer = build(env_id, TinyModelConfig())
        params = sum(p.numel() for p in model.parameters()) / 1e6
        for machine, busy in conditions:
            rows += measure(f"{env_id}, {params:.2f}M, {machine}", arms, model, tokenizer, env_id, reps, busy, workload)
    if not args.quick and not args.only and "larger" in args.models and "quiet" in args.conditions:
        model, tokenizer = build("babyai", LARGER)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        rows += measure(f"babyai, {params:.1f}M, quiet", ["ours", "ours, 1 thread", "TRL 1.16", "TRL 1.16, 1 thread"],
                        model, tokenizer, "babyai", reps, 0, workload)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads by default; {workload['task_count']} tasks × {workload['samples']} "
          f"samples, {workload['turns']} turns, {workload['new_tokens']} new tokens per turn, temperature 1, "
          f"untrained model; median (min–max) of {reps} interleaved repetitions")
    print("\n".join(header + rows))


if __name__ == "__main__":
    main()
