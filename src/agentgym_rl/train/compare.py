"""Training several configurations under the same seeds and budget, then comparing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..config import RLConfig, load_config
from ..errors import UserError
from ..eval.compare import format_comparison, plot_comparison, summarize_runs
from ..runs import checkpoint_step, latest_checkpoint
from .rl import RLTrainer


def run_comparison(configs: list[Path], seeds: list[int], overrides: list[str], out_dir: Path,
                   log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Train every config with every seed into `out_dir/<config>_s<seed>`, then write
    `out_dir/comparison.md` and `out_dir/comparison.png`.

    The overrides apply to every run (e.g. a shared warm-started model:
    `model.path=... warmup.episodes=0`). A run whose last checkpoint is already at its final
    step is not trained again, so an interrupted comparison can be restarted.
    """
    if not configs:
        raise UserError("give at least one config file")
    labels = [Path(c).stem for c in configs]
    if len(set(labels)) != len(labels):
        raise UserError("config file names must differ (they name the runs)")
    runs: dict[str, list[Path]] = {}
    planned = []
    for path, label in zip(configs, labels):
        for seed in seeds:
            config = load_config(RLConfig, path, [*overrides, f"run.seed={seed}", f"run.output_dir={out_dir}",
                                                  f"run.name={label}_s{seed}"])
            planned.append((label, config))
    episodes = None
    for label, config in planned:
        runs.setdefault(label, []).append(config.run.dir)
        episodes = config.eval.episodes
        last = latest_checkpoint(config.run.dir)
        if last is not None and checkpoint_step(last) >= config.train.steps:
            log(f"{config.run.dir}: already complete, not retrained")
            continue
        log(f"training {config.run.dir} ({config.algo.name}, seed {config.run.seed})")
        RLTrainer(config, log=log).fit(resume=last is not None)
    rows = summarize_runs(runs)
    table = format_comparison(rows, episodes)
    (out_dir / "comparison.md").write_text(table + "\n")
    image = plot_comparison(runs, out_dir / "comparison.png")
    log("\n" + table)
    log(f"table: {out_dir / 'comparison.md'}  plot: {image}")
    return {"rows": rows, "table": table, "plot": str(image)}
