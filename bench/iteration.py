"""Where a CPU training step spends its time: one RL iteration of each algorithm split into
rollout / scoring (recomputed old logprobs, critic values, reference logprobs) / optimizer
updates, with the run's peak memory; and each environment's reset and step times.

Run by hand (`make bench`); copy the printed tables into docs/BENCHMARKS.md with the date and
machine. Nothing here is asserted in tests.

    python bench/iteration.py [--steps 6] [--threads 1] [--algorithms ppo grpo] [--envs babyai textcraft]

Each algorithm runs its own BabyAI config (`configs/babyai_ALGO.yaml`, the settings a user
starts from) without a warm-up, so every run plays the same untrained tiny model, and updates
on every episode (`algo.skip_zero_advantage=false`, and for LOOP `algo.drop_threshold=0`: an
untrained model's groups rarely differ, and skipped rows would make the update look free); the
parts are the medians over its steps after the first (which also builds caches and threads),
the whole step with its min–max. `--threads N` runs the training processes on N CPU threads
(torch's, generation's and the BLAS libraries'); by default they use torch's own count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALGORITHMS = ["ppo", "grpo", "reinforce++", "rloo", "loop"]


def algorithm_row(algorithm: str, steps: int, out: Path, threads: int) -> str:
    keep_every_episode = ["algo.skip_zero_advantage=false"] + (["algo.drop_threshold=0"] if algorithm == "loop" else [])
    pinned = [f"rollout.threads={threads}"] if threads else []
    command = [sys.executable, "-m", "agentgym_rl.cli", "train", f"configs/babyai_{algorithm}.yaml",
               "warmup.episodes=0", *keep_every_episode, *pinned, f"train.steps={steps}", "train.validate_every=0",
               f"train.save_every={steps}", f"run.output_dir={out}", f"run.name={algorithm}"]
    environment = dict(os.environ)
    if threads:  # torch reads these when it starts; its default count otherwise follows the cores
        environment.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log = out / f"{algorithm}.log"
    with log.open("w") as sink:
        result = subprocess.run(["/usr/bin/time", "-v", *command], stdout=sink, stderr=subprocess.STDOUT, cwd=REPO,
                                env=environment)
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        raise SystemExit(f"{algorithm} failed; see {log}")
    peak_gb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) / 1e6
    rows = [json.loads(line) for line in (out / algorithm / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/rollout_s" in r][1:]

    def median(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rows)

    rollout, update, score = median("time/rollout_s"), median("time/update_s"), median("time/score_s")
    total = rollout + update
    whole_steps = [r["time/rollout_s"] + r.get("time/update_s", 0.0) for r in rows]
    episodes = median("update/trajectories")
    return (f"| {algorithm} | {total:.1f} s ({min(whole_steps):.1f}–{max(whole_steps):.1f}) | "
            f"{rollout:.1f} s ({100 * rollout / total:.0f}%) | "
            f"{score:.2f} s ({100 * score / total:.0f}%) | {update - score:.1f} s ({100 * (update - score) / total:.0f}%) "
            f"| {median('update/optimizer_steps'):.0f} | {episodes:.0f} | {peak_gb:.2f} GB |")


def env_row(env_id: str, items: int, turns: int) -> str:
    """Resets of `items` train items and up to `turns` expert steps on each, timed apart from
    the expert's own thinking."""
    from agentgym_rl.envs import make, tasks

    env = make(env_id)
    reset_s, step_s = [], []
    try:
        for task in tasks(env_id, "train")[:items]:
            began = time.perf_counter()
            env.reset(task.index)
            reset_s.append(time.perf_counter() - began)
            for _ in range(turns):
                action = env.expert_action()
                began = time.perf_counter()
                _, _, terminated, truncated, _ = env.step(action)
                step_s.append(time.perf_counter() - began)
                if terminated or truncated:
                    break
    finally:
        env.close()
    return (f"| {env_id} | {1000 * statistics.median(reset_s):.1f} ms | {1000 * max(reset_s):.1f} ms | "
            f"{1000 * statistics.median(step_s):.2f} ms | {1000 * max(step_s):.1f} ms | {len(step_s)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="RL steps per algorithm (the first is left out)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads of the training runs (0: torch's default)")
    parser.add_argument("--algorithms", nargs="*", default=ALGORITHMS)
    parser.add_argument("--envs", nargs="*", default=["babyai", "textcraft", "sciworld"])
    parser.add_argument("--items", type=int, default=20, help="items reset per environment")
    args = parser.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2: the first step is left out of the medians")
    if args.threads < 0:
        raise SystemExit("--threads must be 0 (torch's default) or a count of threads")
    with tempfile.TemporaryDirectory() as tmp:
        print("| algorithm | one step | rollout | scoring | optimizer updates | updates | episodes updated on "
              "| peak RSS |\n|---|---|---|---|---|---|---|---|")
        for algorithm in args.algorithms:
            print(algorithm_row(algorithm, args.steps, Path(tmp), args.threads), flush=True)
    print("\n| environment | reset (median) | reset (max) | step (median) | step (max) | steps |\n|---|---|---|---|---|---|")
    for env_id in args.envs:
        print(env_row(env_id, args.items, 30), flush=True)


if __name__ == "__main__":
    main()
