"""Synchronous against asynchronous RL (`train.asynchronous`, `rollout.max_staleness`) on one
config: the wall time of an RL step, how stale the trained data was, and what each run reached.

The synchronous arm runs the config end to end (its warm-up included); each asynchronous arm
starts from that run's `warmup_model`, so that the arms differ only in how their steps overlap.
Run by hand, alone on the machine (two processes would share its cores); copy the table into
docs/BENCHMARKS.md with the date and machine. Nothing here is asserted in tests.

    python bench/async_rl.py [--config src/agentgym_rl/configs/quickstart.yaml] [--staleness 1 2] [--steps 44]
                             [--warmup-from runs/bench_async/sync/warmup_model] [--journal]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentgym_rl.quickstart import paired_difference
from agentgym_rl.train.asynchronous import staleness_histogram

REPO = Path(__file__).resolve().parent.parent


def train(config: str, name: str, out: Path, overrides: list[str]) -> tuple[list[dict], float]:
    """(metrics.jsonl rows, wall seconds) of one training run."""
    command = [sys.executable, "-m", "agentgym_rl.cli", "train", config, f"run.output_dir={out}",
               f"run.name={name}", "run.overwrite=true", *overrides]
    began = time.time()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    return rows, time.time() - began


def final_items(run_dir: Path) -> dict[str, float]:
    """Each validation item's success in the run's last validation."""
    last = sorted((run_dir / "validation").glob("step_*.jsonl"))[-1]
    per_item: dict[str, list[bool]] = {}
    for line in last.read_text().splitlines():
        record = json.loads(line)
        per_item.setdefault(record["item_id"], []).append(bool(record["success"]))
    return {item: sum(s) / len(s) for item, s in per_item.items()}


def paired(a: dict[str, float], b: dict[str, float]) -> tuple[float, float]:
    """Mean of b − a over the items, in points, and its standard error."""
    mean, se, _, _ = paired_difference(a, b)
    return 100 * mean, 100 * se


def summary(name: str, rows: list[dict], wall: float) -> dict:
    steps = [r for r in rows if "train/success" in r]
    validations = [r for r in rows if "val/success" in r]
    # The first step also builds caches and (asynchronously) starts the generator: left out.
    step_s = [r["time/step_s"] for r in steps[1:]]
    histogram = staleness_histogram([r.get("async/staleness", 0) for r in steps])
    journal = [r["time/journal_s"] / r["time/rollout_s"] for r in steps if "time/journal_s" in r]
    return {"arm": name, "steps": len(steps), "step_s": statistics.median(step_s),
            "journal_share": statistics.median(journal) if journal else None,
            "journal_mb": max((r["rollout/journal_mb"] for r in steps if "rollout/journal_mb" in r), default=None),
            "step_s_range": (min(step_s), max(step_s)), "rl_s": sum(r["time/step_s"] for r in steps),
            "wait_s": statistics.median([r.get("time/wait_s", 0.0) for r in steps[1:]]),
            "staleness": histogram, "val_before": validations[0]["val/success"],
            "val_after": validations[-1]["val/success"], "train_success_last10": statistics.mean(
                r["train/success"] for r in steps[-10:]), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="src/agentgym_rl/configs/quickstart.yaml")
    parser.add_argument("--staleness", type=int, nargs="*", default=[1, 2], help="max_staleness of each async arm")
    parser.add_argument("--steps", type=int, help="override train.steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_async")
    parser.add_argument("--set", nargs="*", default=[], help="overrides put on every arm")
    parser.add_argument("--journal", action="store_true", help="also a sync arm with rollout.journal_every=1")
    parser.add_argument("--warmup-from", help="a warmed-up model folder every arm starts from (the sync arm "
                                              "then skips its warm-up too): for timings alone")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    common = [f"run.seed={args.seed}", *([f"train.steps={args.steps}"] if args.steps else []), *args.set]
    warmed = Path(args.warmup_from).resolve() if args.warmup_from else out / "sync" / "warmup_model"
    warm = [f"model.path={warmed}", "warmup.episodes=0"]
    rows, wall = train(args.config, "sync", out, [*common, *(warm if args.warmup_from else [])])
    results = [summary("sync", rows, wall)]
    synchronous = final_items(out / "sync")
    results[0]["vs_sync"] = (0.0, 0.0)
    if args.journal:  # what writing the in-flight episodes every turn costs a synchronous run
        rows, wall = train(args.config, "sync_journal", out, [*common, *warm, "rollout.journal_every=1"])
        results.append({**summary("sync, journal every turn", rows, wall),
                        "vs_sync": paired(synchronous, final_items(out / "sync_journal"))})
    for k in args.staleness:
        rows, wall = train(args.config, f"async_k{k}", out,
                           [*common, *warm, "train.asynchronous=true", f"rollout.max_staleness={k}"])
        results.append({**summary(f"async k={k}", rows, wall),
                        "vs_sync": paired(synchronous, final_items(out / f"async_k{k}"))})
    (out / "results.json").write_text(json.dumps(results, indent=1))
    base = results[0]["step_s"]
    print("| arm | RL step, median (min–max) | vs sync | learner's wait | RL steps' total | staleness: steps "
          "| val success before → after | − sync (paired SE) | train success, last 10 steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        low, high = r["step_s_range"]
        staleness = ", ".join(f"{k}: {n}" for k, n in r["staleness"].items())
        change, se = r["vs_sync"]
        print(f"| {r['arm']} | {r['step_s']:.2f} s ({low:.2f}–{high:.2f}) | {r['step_s'] / base:.2f}x | "
              f"{r['wait_s']:.2f} s | {r['rl_s'] / 60:.1f} min | {staleness} | "
              f"{100 * r['val_before']:.1f}% → {100 * r['val_after']:.1f}% | {change:+.1f} ({se:.1f}) | "
              f"{100 * r['train_success_last10']:.1f}% |")
    for r in results:
        if r["journal_share"] is not None:
            print(f"{r['arm']}: journal writes took {100 * r['journal_share']:.1f}% of the rollout time (median "
                  f"step), the largest journal {r['journal_mb']:.2f} MB")


if __name__ == "__main__":
    main()
