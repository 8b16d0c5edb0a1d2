"""Does an RL run change more test items than any weight change of its size would?

An RL run moves its starting model by some Δθ and its greedy test success by some items gained
and lost. This builds `--draws` placebo models: the starting model plus random noise with, in
every tensor, the Frobenius norm of that tensor's Δθ (direction random, size RL's). Each is
evaluated as the run's validation was (`eval --run RUN --policy PLACEBO`), and its items
gained/lost against the starting model are set beside RL's. If random moves of RL's size flip as
many items as RL did, the test split cannot tell RL's effect at that size from noise.

Run by hand on a finished RL run that started from a warm-up (e.g. one of bench/strong_agent.py's):

    python bench/update_noise.py RUN [--draws 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from strong_agent import CLI, REPO, item_success, starting_model  # the study runner's readers of a run

from agentgym_rl.quickstart import paired_difference
from agentgym_rl.runs import latest_model


def placebo(start: dict[str, torch.Tensor], final: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """`start` plus, per tensor, Gaussian noise scaled to the norm of that tensor's RL change."""
    generator = torch.Generator().manual_seed(seed)
    moved = {}
    for name, weights in start.items():
        change = (final[name].double() - weights.double()).norm()
        noise = torch.randn(weights.shape, generator=generator, dtype=torch.float64)
        moved[name] = (weights.double() + noise * (change / noise.norm())).to(weights.dtype)
    return moved


def evaluate(run: Path, model: Path, out: Path) -> dict[str, float]:
    subprocess.run([*CLI, "eval", "--run", str(run), "--policy", str(model), "--trajectories", str(out)],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return item_success(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished RL run folder")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start_dir, final_dir = starting_model(args.run), latest_model(args.run)
    validations = sorted((args.run / "validation").glob("step_*.jsonl"))
    if not start_dir.is_dir() or len(validations) < 2:
        raise SystemExit(f"{args.run} needs its starting model and validations before and after RL")
    before, after = item_success(validations[0]), item_success(validations[-1])
    start, final = load_file(start_dir / "model.safetensors"), load_file(final_dir / "model.safetensors")
    relative = (sum((final[k].double() - start[k].double()).norm() ** 2 for k in start) ** 0.5
                / sum(start[k].double().norm() ** 2 for k in start) ** 0.5)
    print(f"# {args.run}: RL moved the weights by {float(relative):.2e} of their norm")
    print("| model | success | change (gained / lost, paired SE) |")
    print("|---|---|---|")
    print(f"| start ({start_dir.name}) | {100 * sum(before.values()) / len(before):.1f}% | |")

    def row(name: str, items: dict[str, float]) -> None:
        delta, se, gained, lost = paired_difference(before, items)
        print(f"| {name} | {100 * sum(items.values()) / len(items):.1f}% | "
              f"{100 * delta:+.1f} ({gained} / {lost}, {100 * se:.1f}) |", flush=True)

    row(f"RL ({final_dir.parent.name})", after)
    with tempfile.TemporaryDirectory() as scratch:
        # the method's check: the starting model played again must give the step-0 items exactly
        row("start, played again", evaluate(args.run, start_dir, Path(scratch) / "start.jsonl"))
        for draw in range(args.draws):
            folder = Path(scratch) / f"placebo_{draw}"
            shutil.copytree(start_dir, folder)
            save_file(placebo(start, final, args.seed + draw), folder / "model.safetensors", metadata={"format": "pt"})
            row(f"placebo {draw} (random, RL's size)", evaluate(args.run, folder, Path(scratch) / f"{draw}.jsonl"))


if __name__ == "__main__":
    main()
