"""Greedy test success against the experience a run had: the turns its training steps played.

Runs of one recipe differ in how many steps they took and how long their episodes were (a 2-turn
step plays ~120 turns of 16 tasks × 4, an 8-turn step ~450), so success against steps mixes
the two. Against the turns played so far (the sum over `trajectories/step_*.jsonl` of each
episode's turns, as `bench/run_table.py` counts them) the runs line up on one axis. One line a run
through its validations (`validation/step_N.jsonl`); `--eval FILE@STEP` adds an evaluation of the
step-N checkpoint written elsewhere (`agentgym-rl eval --trajectories FILE`) to the run whose folder
holds FILE.

    python bench/experience_plot.py runs/pre_both_s0 runs/pre_both_s1 \\
        --eval runs/pre_both_s1/eval_step36.jsonl@36 --label pre_both_s1="seed 1" --out docs/x.png

Prints each point as a table row too; run by hand, in seconds.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from agentgym_rl.errors import UserError
from agentgym_rl.jsonlines import read_json_lines
from run_table import episode_turns  # bench/ is on the path: the script's own folder

STEP_FILE = re.compile(r"step_(\d+)\.jsonl")


class RunPoints:
    """One run's greedy successes by the turns played before the validated checkpoint."""

    def __init__(self, name: str):
        self.name = name
        self.turns_by_step: dict[int, int] = {}  # the turns each step played
        self.success_by_step: dict[int, float] = {}

    def points(self) -> list[tuple[int, int, float]]:
        """(step, turns played through that step, success), by step. A validated step whose
        trajectories are missing counts as none played; `turns_missing` names those steps."""
        out = []
        for step in sorted(self.success_by_step):
            turns = sum(t for s, t in self.turns_by_step.items() if s <= step)
            out.append((step, turns, self.success_by_step[step]))
        return out

    def turns_missing(self) -> list[int]:
        last = max(self.success_by_step, default=0)
        return [s for s in range(1, last + 1) if s not in self.turns_by_step]


def success(path: Path) -> float:
    episodes = read_json_lines(path)
    if not episodes:
        raise UserError(f"{path} holds no episodes")
    return sum(bool(e.get("success")) for e in episodes) / len(episodes)


def read_run(run: Path) -> RunPoints:
    """The turns each saved step played and the success of each validation of `run`."""
    if not (run / "metrics.jsonl").is_file():
        raise UserError(f"{run} is not a run folder (no metrics.jsonl)")
    points = RunPoints(run.name)
    for step, path in step_files(run / "trajectories"):
        points.turns_by_step[step] = sum(episode_turns(e) for e in read_json_lines(path))
    for step, path in step_files(run / "validation"):
        points.success_by_step[step] = success(path)
    return points


def step_files(folder: Path) -> list[tuple[int, Path]]:
    """The `step_N.jsonl` files of `folder`, with N."""
    found = ((STEP_FILE.fullmatch(path.name), path) for path in folder.glob("step_*.jsonl"))
    return [(int(match.group(1)), path) for match, path in found if match]


def parse_eval(text: str) -> tuple[Path, int]:
    path, at, step = text.rpartition("@")
    if not at or not step.isdigit():
        raise UserError(f"--eval {text}: expected FILE@STEP, e.g. runs/x/eval_step36.jsonl@36")
    return Path(path), int(step)


def parse_label(text: str) -> tuple[str, str]:
    name, eq, label = text.partition("=")
    if not eq or not name or not label:
        raise UserError(f"--label {text}: expected RUN=TEXT, e.g. pre_both_s1=\"seed 1\"")
    return name, label


def figure(runs: list[RunPoints], labels: dict[str, str]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for run in runs:
        _, turns, rates = zip(*run.points())
        ax.plot(turns, [100 * r for r in rates], marker="o", label=labels.get(run.name, run.name))
    ax.set_xlabel("turns played in training so far")
    ax.set_ylabel("greedy success on the test items (%)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (runs/<name>)")
    parser.add_argument("--eval", action="append", default=[], metavar="FILE@STEP",
                        help="an evaluation of the step-STEP checkpoint kept in the run's folder; repeatable")
    parser.add_argument("--label", action="append", default=[], metavar="RUN=TEXT", help="a run's legend entry")
    parser.add_argument("--out", type=Path, help="the PNG to write (none: the table alone)")
    args = parser.parse_args(argv)
    try:
        runs = {path.resolve(): read_run(path) for path in args.runs}
        for path, step in map(parse_eval, args.eval):
            if path.resolve().parent not in runs:
                raise UserError(f"--eval {path}: its folder is not one of the runs given")
            runs[path.resolve().parent].success_by_step[step] = success(path)
        labels = dict(map(parse_label, args.label))
        print("| run | step | turns played | greedy success |\n|---|---|---|---|")
        for run in runs.values():
            if not run.success_by_step:
                raise UserError(f"{run.name} has no validation and no --eval")
            missing = run.turns_missing()
            if missing:
                print(f"warning: {run.name} has no trajectories for steps {missing[:5]}: counted as 0 turns",
                      file=sys.stderr)
            for step, turns, rate in run.points():
                print(f"| {labels.get(run.name, run.name)} | {step} | {turns:,} | {100 * rate:.1f}% |")
        if args.out:
            fig = figure(list(runs.values()), labels)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(args.out, dpi=100)
            print(f"wrote {args.out}")
    except (UserError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
