"""Keep a run's step-0 validation for `train.baseline`, with the settings it was played with.

    python bench/keep_baseline.py runs/NAME bench/baselines/NAME_step0.jsonl.gz

Writes the validation gzipped and, beside it, `NAME_step0.settings.json`: the run's settings
that change an episode after its first turn (`train.baseline.PLAYING_KEYS`). A run given the file
replays only first turns, so without these a file played with other environment options or
another turn limit would pass its check (`src/agentgym_rl/train/baseline.py`).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

from agentgym_rl.config import RLConfig, load_config, to_dict
from agentgym_rl.errors import UserError
from agentgym_rl.runs import CONFIG
from agentgym_rl.train.baseline import write_settings


def keep(run_dir: Path, target: Path, step: int = 0) -> Path:
    """Copy `run_dir`'s validation at `step` to `target` (gzipped when it ends in .gz) and write
    its settings file. Returns the settings file."""
    source = run_dir / "validation" / f"step_{step:06d}.jsonl"
    if not (run_dir / CONFIG).is_file():
        raise UserError(f"{str(run_dir)!r} is not a run folder: it has no {CONFIG}")
    if not source.is_file():
        raise UserError(f"{str(run_dir)!r} holds no validation of step {step} ({source.name}); runs save "
                        "them with train.save_trajectories")
    if target.name.endswith(".gz"):
        with source.open("rb") as read, gzip.open(target, "wb") as write:
            shutil.copyfileobj(read, write)
    else:
        shutil.copyfile(source, target)
    return write_settings(target, to_dict(load_config(RLConfig, run_dir / CONFIG)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run folder (runs/NAME)")
    parser.add_argument("target", type=Path, help="where to keep it, e.g. bench/baselines/NAME_step0.jsonl.gz")
    parser.add_argument("--step", type=int, default=0, help="the validation's step (default 0)")
    args = parser.parse_args(argv)
    try:
        settings = keep(args.run_dir, args.target, args.step)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"kept {args.target} and {settings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
