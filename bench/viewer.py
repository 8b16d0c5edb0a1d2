"""How fast the viewer (`agentgym-rl view`) lists and filters a large run.

    python bench/viewer.py [--trajectories 10000] [--tokens 1500]

Writes a run folder of `--trajectories` episodes (100 steps of trajectory files) whose lines are
as large as a BabyAI rollout's (`--tokens` ids, loss mask and logprobs each, 20 turns of
messages). Times the indexing of every file, which the viewer does in a background thread at
start, then its HTTP API in process: a listing asked for at once (it meets the indexing), a
listing again, filters by success, item and category, the last page, and one trajectory with
its tokens. Each call after the first is timed 5 times; the median is reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from agentgym_rl.agent.tiny import build_tiny
from agentgym_rl.ui.app import create_app
from agentgym_rl.ui.index import TrajectoryIndex

CATEGORIES = ["GoTo", "Pickup", "Open", "PutNext", "Unlock", "Synth"]


def write_run(run_dir: Path, trajectories: int, tokens: int, steps: int = 100) -> int:
    """A run folder with `trajectories` lines spread over `steps` files; returns its bytes."""
    rng = random.Random(0)
    (run_dir / "trajectories").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("env: {id: babyai}\nalgo: {name: grpo}\n")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/success": rng.random()}) + "\n"
                                                   for s in range(1, steps + 1)))
    build_tiny(["Your goal: go to the red ball. Action: turn left"] * 20, run_dir / "base_model")
    total = 0
    per_step = trajectories // steps
    for step in range(1, steps + 1):
        lines = []
        for k in range(per_step):
            mask = [int(rng.random() < 0.1) for _ in range(tokens)]
            record = {
                "env_id": "babyai", "item_id": f"babyai_{rng.randrange(5000)}",
                "category": rng.choice(CATEGORIES), "group": k // 4,
                "messages": [{"role": "user" if t % 2 == 0 else "assistant", "content": "You can see a red ball " * 12}
                             for t in range(41)],
                "input_ids": [rng.randrange(5, 300) for _ in range(tokens)], "loss_mask": mask,
                "logprobs": [round(-rng.random(), 4) if m else 0.0 for m in mask],
                "turn_rewards": [0.0] * 19 + [float(rng.random() < 0.5)], "success": rng.random() < 0.5,
                "invalid_actions": rng.randrange(5), "error": None,
            }
            record["reward"], record["turns"] = sum(record["turn_rewards"]), 20
            lines.append(json.dumps(record))
        text = "\n".join(lines) + "\n"
        (run_dir / "trajectories" / f"step_{step:06d}.jsonl").write_text(text)
        total += len(text)
    return total


def timed(call, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runs = Path(folder)
        size = write_run(runs / "big", args.trajectories, args.tokens)
        cold = TrajectoryIndex()
        start = time.perf_counter()
        cold.warm(runs)
        indexing = time.perf_counter() - start
        client = TestClient(create_app(runs, allowed_hosts=["testserver"]))  # indexes again, in its background thread

        def get(path: str, **params) -> dict:
            response = client.get(path, params=params)
            response.raise_for_status()
            return response.json()

        start = time.perf_counter()
        listed = get("/api/runs/big/trajectories")
        first = time.perf_counter() - start
        assert listed["total"] == args.trajectories, listed["total"]
        item = listed["rows"][0]["item_id"]
        rows = {
            "indexing every file (at start, in the background)": indexing,
            "first listing (started at once, meets the indexing)": first,
            "listing again (summaries cached)": timed(lambda: get("/api/runs/big/trajectories")),
            "filter success=false": timed(lambda: get("/api/runs/big/trajectories", success="false")),
            f"filter item={item}": timed(lambda: get("/api/runs/big/trajectories", item=item)),
            "filter category + step": timed(lambda: get("/api/runs/big/trajectories", category="GoTo", step=50)),
            "last page (offset total-100)": timed(lambda: get("/api/runs/big/trajectories",
                                                              offset=args.trajectories - 100)),
            "one trajectory with its tokens": timed(lambda: get("/api/runs/big/trajectory", split="trajectories",
                                                                step=100, line=0)),
        }
    print(f"viewer over {args.trajectories:,} trajectories of {args.tokens} tokens ({size / 2**20:.0f} MiB of "
          f"JSONL), {platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d')}")
    print("| call | seconds (median of 5; the first listing once) |\n|---|---|")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
