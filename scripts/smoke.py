"""`make smoke`: every top-level config in configs/ run with `--smoke`, one after the other, each
checked to have updated the policy from a real signal, with its wall time.

  RL    a step whose update kept rows (`update/trajectories`), took optimizer steps and had
        advantages that are not all zero on its tokens (`adv/token_abs_mean`)
  sft   optimizer steps on demonstrations (a `loss` line per step)
  dpo   optimizer steps on preference pairs (a `loss` line per step after `pairs`)
  rft   a round that fine-tuned on kept successes (`sft/conversations` > 0)

Usage: python scripts/smoke.py [--out runs/smoke] [CONFIG ...]   (default: configs/*.yaml)
Exit status 1 when a config failed or updated nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def evidence(command: str, rows: list[dict]) -> str | None:
    """What shows the policy was updated from a real signal, or None."""
    if command == "train":
        updated = [r for r in rows if r.get("update/trajectories", 0) > 0 and r.get("update/optimizer_steps", 0) > 0
                   and r.get("adv/token_abs_mean", 0) > 0]
        return (f"{len(updated)} step{'s' * (len(updated) != 1)} updated, |advantage| {updated[0]['adv/token_abs_mean']:.3f}, "
                f"{sum(r['update/trajectories'] for r in updated)} rows") if updated else None
    if command in ("sft", "dpo"):
        steps = [r for r in rows if "loss" in r and r["step"] > 0]
        pairs = next((r["pairs"] for r in rows if "pairs" in r), "?")
        what = "demonstrations" if command == "sft" else f"{pairs} pairs"
        return f"{len(steps)} optimizer steps on {what}" if steps else None
    kept = sum(r.get("sft/conversations", 0) for r in rows)
    return f"fine-tuned on {kept} kept successes" if kept else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs/smoke"), help="run.output_dir of the smoke runs")
    args = parser.parse_args()
    from agentgym_rl.config.describe import config_kind

    configs = args.configs or sorted((REPO / "configs").glob("*.yaml"))
    results = []
    for config in configs:
        command = config_kind(config, "auto")
        argv = [sys.executable, "-m", "agentgym_rl.cli", command, str(config), "--smoke", f"run.output_dir={args.out}"]
        print(f"== {' '.join(argv[2:])}", flush=True)
        began = time.time()
        done = subprocess.run(argv, capture_output=True, text=True)
        seconds = time.time() - began
        name = next((line.split("run folder: ")[1].split()[0] for line in done.stdout.splitlines()
                     if line.startswith("run folder: ")), None)
        rows = []
        if name is not None and (Path(name) / "metrics.jsonl").is_file():
            rows = [json.loads(line) for line in (Path(name) / "metrics.jsonl").read_text().splitlines()]
        found = evidence(command, rows) if done.returncode == 0 else None
        why = found or (f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:200]}"
                        if done.returncode else "updated nothing")
        results.append((config.name, command, seconds, found is not None, why))
        print(f"   {seconds:.0f} s  {'ok' if found else 'FAILED'}: {why}", flush=True)
    print("\n| config | command | wall | updated from a real signal |\n|---|---|---|---|")
    for name, command, seconds, ok, why in results:
        print(f"| {name} | {command} | {seconds:.0f} s | {'yes' if ok else 'NO'}: {why} |")
    return 0 if all(ok for *_, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
