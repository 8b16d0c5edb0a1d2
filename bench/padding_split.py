"""What running a prefill's leading padded columns apart saves: the same multi-turn rollout with
`HFGenerator`'s head split (the default) and with every row padded to the longest
(`generator.MIN_HEAD_SAVING` above 1), interleaved, at a pinned thread count.

Run by hand (`make bench`); its table goes into docs/BENCHMARKS.md with the date and machine.

    python bench/padding_split.py [--reps 5] [--turns 8] [--threads 2] [--envs babyai textcraft] [--larger]

The workload is `bench/rollout_vs_trl.py`'s: 8 train tasks × 4 samples, 12 new tokens per turn,
temperature 1, the untrained tiny model (or, with `--larger`, the 27.5M one). Columns are the
prompt columns run through the model (padding included), summed over rows, against the prompt
tokens of the finished episodes.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
from rollout_vs_trl import LARGER, build, play, ratio_spread, spread

import agentgym_rl.agent.generator as generator_module
from agentgym_rl.agent.tiny import TinyModelConfig

ARMS = {"split (default)": generator_module.MIN_HEAD_SAVING, "padded to the longest": 2.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--threads", type=int, choices=[1, 2], default=2)
    parser.add_argument("--envs", nargs="*", default=["babyai", "textcraft"])
    parser.add_argument("--larger", action="store_true", help="the 27.5M model instead of the tiny one")
    args = parser.parse_args()
    arm_name = f"ours, {args.threads} thread{'s' if args.threads > 1 else ''}"
    workload = {"task_count": 8, "samples": 4, "turns": args.turns, "new_tokens": 12}
    rows = []
    for env_id in args.envs:
        model, tokenizer = build(env_id, LARGER if args.larger else TinyModelConfig())
        params = sum(p.numel() for p in model.parameters()) / 1e6
        play(arm_name, model, tokenizer, env_id, **{**workload, "task_count": 2, "turns": 2})  # warm-up
        results: dict[str, list[tuple[float, int, int, int]]] = {arm: [] for arm in ARMS}
        for _ in range(args.reps):
            for arm, saving in ARMS.items():
                generator_module.MIN_HEAD_SAVING = saving
                seconds, generated, _, trajectories, generator = play(arm_name, model, tokenizer, env_id, **workload)
                prefilled = generator.prefilled_columns
                prompt_tokens = sum(len(t.input_ids) - sum(t.loss_mask) for t in trajectories)
                results[arm].append((seconds, generated, prefilled, prompt_tokens))
                print(f"  {env_id} {arm}: {seconds:.1f} s, {prefilled / prompt_tokens:.2f}× columns", flush=True)
        generator_module.MIN_HEAD_SAVING = ARMS["split (default)"]
        padded = results["padded to the longest"]
        for arm, runs in results.items():
            per_s = [g / s for s, g, _, _ in runs]
            speedup = [(g / s) / (gp / sp) for (s, g, _, _), (sp, gp, _, _) in zip(runs, padded)]
            columns = [c / p for _, _, c, p in runs]
            rows.append(f"| {env_id}, {params:.2f}M | {arm} | {ratio_spread(columns)} | {spread(per_s)} | "
                        f"{ratio_spread(speedup)} |")
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} "
          f"thread(s); {workload['task_count']} tasks × {workload['samples']} samples, {args.turns} turns; "
          f"median (min–max) of {args.reps} interleaved repetitions after a warm-up")
    print("| env, model | prefill | prompt columns run / prompt tokens | generated tokens/s | "
          "vs padded (within rep) |\n|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
