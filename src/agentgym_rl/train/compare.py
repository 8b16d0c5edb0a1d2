"""Training several configurations under the same seeds and budget, then comparing them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import RLConfig, load_config
from ..config.describe import load_for_command
from ..errors import UserError
from ..eval.compare import format_comparison, format_each_run, plot_comparison, summarize_runs
from ..runs import checkpoint_step, holds_run, latest_checkpoint, trained_steps
from .rl import RLTrainer, validation_missing

POLL_S = 1.0
"""How often `train_in_processes` looks for runs that ended."""


@dataclass
class PlannedRun:
    """One (config, seed) of a comparison still to train."""

    config_file: Path
    overrides: list[str]
    """Every override of the run, its seed, folder and name included."""
    config: RLConfig
    resume: bool
    """An earlier, unfinished invocation left a checkpoint: go on from it."""


def run_comparison(configs: list[Path], seeds: list[int], overrides: list[str], out_dir: Path, jobs: int = 1,
                   log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Train every config with every seed into `out_dir/<config>_s<seed>`, then write
    `out_dir/comparison.md` and `out_dir/comparison.png`.

    The overrides apply to every run (e.g. a shared warm-started model:
    `model.path=... warmup.episodes=0`). An interrupted comparison can be restarted: a finished
    run is not trained again, an unfinished one goes on from its checkpoint (`run_state`). With `jobs` > 1
    the runs train as separate processes, that many at once (`train_in_processes`); runs that
    failed are named in a `UserError` after the table of the others is written.
    """
    if not configs:
        raise UserError("give at least one config file")
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    labels = [Path(c).stem for c in configs]
    if len(set(labels)) != len(labels):
        raise UserError("config file names must differ (they name the runs)")
    runs: dict[str, list[Path]] = {}
    planned = []
    episodes = None
    for path, label in zip(configs, labels):
        for seed in seeds:
            run_overrides = [*overrides, f"run.seed={seed}", f"run.output_dir={out_dir}", f"run.name={label}_s{seed}"]
            config = load_for_command("train", path, run_overrides)  # an sft/dpo/rft file is named as such
            runs.setdefault(label, []).append(config.run.dir)
            episodes = config.eval.episodes
            state = run_state(config)
            if state == "complete":
                log(f"{config.run.dir}: already complete, not retrained")
                continue
            if state == "afresh" and holds_run(config.run.dir):
                log(f"{config.run.dir}: unfinished, without a checkpoint to go on from: trained afresh")
                run_overrides.append("run.overwrite=true")
                config = load_config(RLConfig, path, run_overrides)
            planned.append(PlannedRun(Path(path), run_overrides, config, resume=state == "resume"))
    failed = []
    if jobs == 1:
        for run in planned:
            log(f"training {run.config.run.dir} ({run.config.algo.name}, seed {run.config.run.seed})")
            RLTrainer(run.config, log=log).fit(resume=run.resume)
    else:
        failed = train_in_processes(planned, jobs, log)
    rows = summarize_runs(runs)
    table = format_comparison(rows, episodes)
    each = format_each_run(rows)
    (out_dir / "comparison.md").write_text(table + "\n" + (f"\n{each}\n" if each else ""))
    image = plot_comparison(runs, out_dir / "comparison.png")
    log("\n" + table + (f"\n\n{each}" if each else ""))
    log(f"table: {out_dir / 'comparison.md'}  plot: {image}")
    if failed:
        raise UserError(f"{len(failed)} of {len(planned)} runs failed: " + "; ".join(failed))
    return {"rows": rows, "table": table, "plot": str(image)}


def run_state(config: RLConfig) -> str:
    """What a comparison does with a run's folder: "complete" (its last step trained, as a
    checkpoint or, with `train.save_every=0`, its metrics show, and validated when that step is
    due one), "resume" (a checkpoint to go on from: the steps left, or only the last one's
    validation) or "afresh" (nothing yet, or a start without a checkpoint)."""
    folder, steps = config.run.dir, config.train.steps
    last = latest_checkpoint(folder)
    done = checkpoint_step(last) if last is not None else trained_steps(folder) if not config.train.save_every else 0
    if done >= steps and not validation_missing(folder, config, steps):
        return "complete"
    return "resume" if last is not None else "afresh"


def train_in_processes(planned: list[PlannedRun], jobs: int, log: Callable[[str], Any] = print) -> list[str]:
    """Train each run as its own `agentgym-rl train` process, at most `jobs` at once, each
    writing its console to `<run folder>.log`; returns a line for each run that failed, in the
    planned order (whichever failed first).

    Meant for the seeds of a small model on one large GPU, of which one run uses a small part
    (a SmolLM2-135M run needed at most 9.6 GB on a CPU). On a CPU the processes share its cores: unless
    OMP_NUM_THREADS is set, each gets an equal share of them. Interrupted, it stops them all.
    """
    from ..progress import progress_bar

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    waiting, running, failed = list(planned), {}, {}
    try:
        with progress_bar(total=len(planned), desc="runs", unit="run") as bar:
            def say(line: str) -> None:
                if bar.disable:
                    log(line)
                else:  # above the bar on a terminal, not into it
                    with type(bar).external_write_mode():
                        log(line)

            while waiting or running:
                while waiting and len(running) < jobs:
                    run = waiting.pop(0)
                    folder = run.config.run.dir
                    folder.parent.mkdir(parents=True, exist_ok=True)
                    console = open(folder.parent / f"{folder.name}.log", "a")
                    command = [sys.executable, "-m", "agentgym_rl.cli", "train", str(run.config_file),
                               *run.overrides, *(["--resume"] if run.resume else [])]
                    process = subprocess.Popen(command, stdout=console, stderr=subprocess.STDOUT, env=env)
                    running[process] = (folder, console, time.monotonic())
                    say(f"training {folder} ({run.config.algo.name}, seed {run.config.run.seed}) in process "
                        f"{process.pid}; its console: {console.name}")
                time.sleep(POLL_S)
                for process in [p for p in running if p.poll() is not None]:
                    folder, console, began = running.pop(process)
                    console.close()
                    bar.update()
                    if process.returncode:
                        failed[folder] = (f"{folder.name} (exit {process.returncode}: {_last_line(console.name)}; "
                                          f"log {console.name})")
                        say(f"{folder}: failed, exit {process.returncode}")
                    else:
                        say(f"{folder}: trained in {time.monotonic() - began:.0f} s")
    finally:
        for process, (_, console, _) in running.items():
            process.terminate()
            process.wait()
            console.close()
    return [failed[run.config.run.dir] for run in planned if run.config.run.dir in failed]


def _last_line(path: str) -> str:
    """The last non-empty line of a run's console (its `error:` line when it stopped on one)."""
    with open(path, errors="replace") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    return lines[-1] if lines else "no output"
