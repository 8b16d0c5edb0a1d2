"""The cost of sampling each episode from its own random stream (`agent/sampling.StreamSampler`):
one decoding step's Gumbel noise and draw over `--rows` rows of a `--vocab`-token vocabulary
(SmolLM2's 49,152 by default), against the greedy argmax it replaces and, with `--against REV`,
the sampler of an earlier commit (or a copy of its `agent/sampling.py`, for a machine without the
repository's history), timed interleaved in the same process, on the CPU or `--device cuda`.

Run by hand (`make bench`); its table goes into docs/BENCHMARKS.md with the date and machine.

    python bench/stream_sampler.py [--rows 8 32 128] [--vocab 49152] [--reps 5] [--against b9e7d5d|FILE]
                                   [--device cuda]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from agentgym_rl.agent.sampling import StreamSampler

REPO = Path(__file__).resolve().parents[1]


def sampler_at(revision: str) -> type:
    """`StreamSampler` as commit `revision` wrote it (its module loaded from `git show`), or as
    the file `revision` holds it."""
    if Path(revision).is_file():
        path = Path(revision)
    else:
        source = subprocess.run(["git", "show", f"{revision}:src/agentgym_rl/agent/sampling.py"], cwd=REPO,
                                check=True, capture_output=True, text=True).stdout
        path = Path(tempfile.mkdtemp()) / f"sampling_{revision}.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.StreamSampler


def step_ms(step, device: torch.device, calls: int = 8) -> float:
    """Mean time of `calls` decoding steps, in ms (on a GPU, until its queued work is done)."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step()  # a first call outside the timing: CUDA kernels load on their first use
    synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        step()
    synchronize()
    return 1000 * (time.perf_counter() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--against", help="a git revision (or a copy of its agent/sampling.py) whose sampler is "
                                          "timed beside this one")
    parser.add_argument("--device", default="cpu", help="where the scores are: cpu or cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    samplers = {"this commit": StreamSampler}
    if args.against:
        samplers[args.against] = sampler_at(args.against)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, vocabulary {args.vocab}, scores on {device}"
          f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}; "
          f"ms per decoding step, median of {args.reps}")
    print("| rows | greedy argmax | " + " | ".join(f"sampler ({name})" for name in samplers) + " |")
    print("|---" * (2 + len(samplers)) + "|")
    for rows in args.rows:
        scores = torch.randn(rows, args.vocab, device=device)
        timed: dict[str, list[float]] = {name: [] for name in ["greedy", *samplers]}
        for _ in range(args.reps):  # interleaved, so that load on the machine falls on every column
            timed["greedy"].append(step_ms(lambda: scores.argmax(-1), device))
            for name, sampler in samplers.items():
                instance = sampler(list(range(1, rows + 1)), [100] * rows, temperature=0.8)
                timed[name].append(step_ms(lambda: instance(None, scores), device))
        cells = {name: statistics.median(values) for name, values in timed.items()}
        print(f"| {rows} | {cells['greedy']:.2f} | " + " | ".join(f"{cells[name]:.1f}" for name in samplers) + " |",
              flush=True)


if __name__ == "__main__":
    main()
