"""The quickstart: build the tiny model, warm it up on expert demonstrations, evaluate,
train with GRPO + ScalingInter-RL, evaluate again, report."""

from __future__ import annotations

import json
import time
from importlib import resources

from .config import RLConfig, load_config
from .eval.evaluate import format_table
from .eval.metrics import Summary, change_sentence, paired_difference
from .eval.plots import plot_run
from .ui.report import write_report
from .train.rl import RLTrainer

QUICKSTART_CONFIG = resources.files("agentgym_rl") / "configs" / "quickstart.yaml"


def before_after_table(before: Summary, after: Summary) -> str:
    categories = sorted(set(before.by_category) | set(after.by_category))
    lines = [f"{'category':<10}{'before RL':>11}{'after RL':>10}{'change':>9}"]
    for name, b, a in [("overall", before.success, after.success)] + [
        (c, before.by_category.get(c, 0.0), after.by_category.get(c, 0.0)) for c in categories
    ]:
        lines.append(f"{name:<10}{100 * b:>10.1f}%{100 * a:>9.1f}%{100 * (a - b):>+8.1f}")
    return "\n".join(lines)


def run_quickstart(overrides: list[str] = (), log=print) -> dict:
    """Run the whole quickstart; returns {"before", "after", "seconds", "run_dir"}."""
    began = time.time()
    with resources.as_file(QUICKSTART_CONFIG) as path:
        config = load_config(RLConfig, path, list(overrides))
    trainer = RLTrainer(config, log=log)
    validations = trainer.fit()
    before, after = validations[0], validations[-1]
    seconds = time.time() - began
    delta, noise, gained, lost = paired_difference(before.item_success, after.item_success)
    image = plot_run(trainer.run_dir)
    report = {"before": before.as_dict(), "after": after.as_dict(), "seconds": seconds,
              "run_dir": str(trainer.run_dir), "delta": delta, "delta_standard_error": noise, "items_gained": gained,
              "items_lost": lost}
    (trainer.run_dir / "report" / "quickstart.json").write_text(json.dumps(report, indent=2))
    log("")
    log(format_table(before.summary, f"after the expert warm-up (step 0), {config.env.id} {config.env.eval_split}"))
    log("")
    steps = f"{after.step} RL step{'s' if after.step != 1 else ''}"
    log(format_table(after.summary, f"after {steps} ({config.algo.name} + ScalingInter-RL)"))
    log("")
    log(before_after_table(before.summary, after.summary))
    log(f"\nRL changed test success by {change_sentence(before.item_success, after.item_success)}; "
        f"validation temperature {config.eval.temperature}")
    if after.step < config.train.steps:
        log(f"RL stopped after {after.step} of {config.train.steps} steps to end within "
            f"train.time_limit_min={config.train.time_limit_min:g} on this CPU; `agentgym-rl quickstart "
            "--overwrite train.time_limit_min=0` trains them all")
    log(f"run folder: {trainer.run_dir}  plot: {image}  wall time: {seconds / 60:.1f} min")
    log(f"report: {write_report(trainer.run_dir)}  (or browse every episode: agentgym-rl view "
        f"{trainer.run_dir.parent})")
    return report
