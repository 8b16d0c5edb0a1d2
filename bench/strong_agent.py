"""The strong-agent study: a recipe's arms × seeds, each run timed, scored after the warm-up
and after RL on the whole test split, and summarised with paired standard errors and a plot.

Run by hand; its tables go into docs/RESULTS.md with the command, machine and date.

    python bench/strong_agent.py bench/studies/babyai_strong.yaml [--seeds 0 1 2] [--arms recipe]
        [--pass-k 0] [--listed-actions-only] [--out runs/study]
    python bench/strong_agent.py bench/studies/babyai_horizon.yaml --set model.path=WARMED_UP_MODEL

A study file names a recipe, the seeds and its arms (overrides put on the recipe):

    config: configs/babyai_strong.yaml
    seeds: [0, 1, 2]
    pass_k: 4                      # Pass@k at temperature 1 of each arm's final model (0: skip)
    listed_actions_only: true      # also greedy success with replies restricted to listed actions
    target: 90                     # the bar (%), drawn on the plot
    arms:
      recipe: []                   # warm-up then RL, as the recipe says
      imitation: [train.steps=1, warmup.epochs=5]   # imitation alone in about the same time

Arms that should differ only in RL share one warm-up per seed: `warmup_from: ARM` names the
arm that runs first (warm-up then RL, as the recipe says), and `{warmup}` in another arm's
overrides becomes that arm's `warmup_model/` for the same seed, e.g.

    warmup_from: grpo
    versus: imitation              # the arm the others are set against (default: the first)
    arms:
      grpo: []
      gigpo: ["model.path={warmup}", warmup.episodes=0, algo.name=gigpo]

Each run is `agentgym-rl train` under `/usr/bin/time -v` (wall time, peak memory); "after the
warm-up" is its validation at step 0, "final" its last validation (greedy, the recipe's `eval`).
A run folder that already has its report is not run again, so a study can be resumed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from agentgym_rl.quickstart import paired_difference
from agentgym_rl.runs import latest_model

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "agentgym_rl.cli"]


def item_success(path: Path) -> dict[str, float]:
    per_item: dict[str, list[bool]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        per_item.setdefault(record["item_id"], []).append(bool(record["success"]))
    return {item: sum(s) / len(s) for item, s in per_item.items()}


def _timed(command: list[str], log: Path) -> dict[str, float]:
    """Run `command` under GNU time, output to `log`; (wall seconds, peak RSS in GB)."""
    with log.open("w") as out:
        result = subprocess.run(["/usr/bin/time", "-v", *command], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}); see {log}")
    clock = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text).group(1)
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return {"wall_s": seconds, "peak_gb": rss_kb / 1024 ** 2}


def _listed_success(run_dir: Path, policy: Path, out: Path) -> float:
    """Greedy success of `policy` with replies restricted to the listed actions, on the run's
    own evaluation (`eval --run RUN --policy MODEL --listed-actions-only`)."""
    summary = out / f"{run_dir.name}_{policy.parent.name if policy.name == 'model' else policy.name}_listed.json"
    subprocess.run([*CLI, "eval", "--run", str(run_dir), "--policy", str(policy), "--listed-actions-only",
                    "--json", str(summary)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return json.loads(summary.read_text())["success"]


def starting_model(run_dir: Path) -> Path:
    """The model a run's step-0 validation played: its warm-up's, else the one it loaded."""
    if (run_dir / "warmup_model").is_dir():
        return run_dir / "warmup_model"
    path = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["path"]
    return Path(path) if path else run_dir / "base_model"


def _listed_report(run_dir: Path, out: Path) -> dict[str, float]:
    return {"warmup_listed": _listed_success(run_dir, starting_model(run_dir), out),
            "final_listed": _listed_success(run_dir, latest_model(run_dir), out)}


def _item_categories(path: Path) -> dict[str, str]:
    return {record["item_id"]: record["category"]
            for record in map(json.loads, path.read_text().splitlines())}


def _pass_at_k(run_dir: Path, out: Path, k: int) -> dict:
    """Avg@k and Pass@k at temperature 1 of a run's final model, overall and per category
    (`eval --run RUN --samples k --temperature 1`); a summary already written is read back."""
    summary = out / f"{run_dir.name}_pass{k}.json"
    if not summary.is_file():
        subprocess.run([*CLI, "eval", "--run", str(run_dir), "--samples", str(k), "--temperature", "1",
                        "--json", str(summary)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    scored = json.loads(summary.read_text())
    return {f"avg_at_{k}": scored["success"], f"pass_at_{k}": scored["pass_at_k"],
            f"avg_at_{k}_by_category": scored["by_category"],
            f"pass_at_{k}_by_category": scored["pass_at_k_by_category"]}


def _complete(report: dict, run_dir: Path, out: Path, pass_k: int, listed: bool) -> dict:
    """Add the evaluations the study asks for and `report` lacks (a run finished by an earlier
    study keeps its training, only the missing scores are computed)."""
    if "categories" not in report:
        report["categories"] = _item_categories(sorted((run_dir / "validation").glob("step_*.jsonl"))[0])
    if pass_k and f"pass_at_{pass_k}" not in report:
        report.update(_pass_at_k(run_dir, out, pass_k))
    if listed and "final_listed" not in report:
        report.update(_listed_report(run_dir, out))
    return report


def run_one(config: str, overrides: list[str], seed: int, name: str, out: Path, pass_k: int,
            listed: bool = False) -> dict:
    """One run of the study (or its saved report), with the evaluations the study asks for."""
    run_dir = out / name
    report_path = run_dir / "study_report.json"
    if report_path.is_file():
        report = json.loads(report_path.read_text())
    else:
        out.mkdir(parents=True, exist_ok=True)
        command = [*CLI, "train", config, *overrides, f"run.seed={seed}", f"run.name={name}",
                   f"run.output_dir={out}"]
        timing = _timed(command, out / f"{name}.log")
        validations = sorted((run_dir / "validation").glob("step_*.jsonl"))
        first, last = item_success(validations[0]), item_success(validations[-1])
        report = {"name": name, "seed": seed, "overrides": overrides, "command": " ".join(command[2:]), **timing,
                  "warmup_success": sum(first.values()) / len(first),
                  "final_success": sum(last.values()) / len(last),
                  "final_step": int(validations[-1].stem.split("_")[1]), "warmup_items": first, "final_items": last}
        report_path.write_text(json.dumps(report, indent=1))
    before = json.dumps(report, sort_keys=True)
    _complete(report, run_dir, out, pass_k, listed)
    if json.dumps(report, sort_keys=True) != before:
        report_path.write_text(json.dumps(report, indent=1))
    return report


def _mean_over_seeds(runs: list[dict], key: str) -> dict[str, float]:
    """Each item's success under `key` ("warmup_items" or "final_items") averaged over the seeds."""
    items = sorted(runs[0][key])
    return {i: sum(r[key][i] for r in runs) / len(runs) for i in items}


def _mean(runs: list[dict], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


def table(reports: dict[str, list[dict]], pass_k: int, listed: bool = False) -> str:
    """Markdown: one row per arm × seed, then each arm's mean with the paired SE of the RL change."""
    lines = ["| arm | seed | after warm-up | final | change (gained / lost, paired SE) | "
             + (f"Pass@{pass_k} (T=1) | " if pass_k else "")
             + ("listed actions only: after warm-up → final | " if listed else "") + "wall | peak RSS |",
             "|---|---|---|---|---|" + ("---|" if pass_k else "") + ("---|" if listed else "") + "---|---|"]
    for arm, runs in reports.items():
        for r in runs:
            delta, se, gained, lost = paired_difference(r["warmup_items"], r["final_items"])
            extra = f"{100 * r[f'pass_at_{pass_k}']:.1f}% | " if pass_k else ""
            if listed:
                extra += f"{100 * r['warmup_listed']:.1f}% → {100 * r['final_listed']:.1f}% | "
            lines.append(f"| {arm} | {r['seed']} | {100 * r['warmup_success']:.1f}% | {100 * r['final_success']:.1f}% "
                         f"| {100 * delta:+.1f} ({gained} / {lost}, {100 * se:.1f}) | {extra}"
                         f"{r['wall_s'] / 60:.1f} min | {r['peak_gb']:.2f} GB |")
        if len(runs) > 1:  # each item's change averaged over the seeds, then its paired SE
            delta, se, _, _ = paired_difference(_mean_over_seeds(runs, "warmup_items"),
                                                _mean_over_seeds(runs, "final_items"))
            lines.append(f"| **{arm}, mean** | {len(runs)} | {100 * _mean(runs, 'warmup_success'):.1f}% | "
                         f"**{100 * _mean(runs, 'final_success'):.1f}%** | "
                         f"{100 * delta:+.1f} (SE {100 * se:.1f}) |" + (" |" if pass_k else "")
                         + (" |" if listed else "") + " | |")
    return "\n".join(lines)


def versus_table(reports: dict[str, list[dict]], versus: str | None = None) -> str:
    """Markdown: each arm's final success against arm `versus`'s (default: the first arm's), paired
    over the items and seeds both ran (e.g. imitation alone against warm-up then RL); "" with one arm."""
    first = versus if versus in reports else next(iter(reports))
    baseline, others = reports[first], [(arm, runs) for arm, runs in reports.items() if arm != first]
    by_seed = {r["seed"]: r for r in baseline}
    lines = [f"| arm | seed | final | {first}'s final | {first} − arm (gained / lost, paired SE) | "
             f"wall: arm, {first} |", "|---|---|---|---|---|---|"]
    for arm, runs in others:
        arm_runs = [r for r in runs if r["seed"] in by_seed]
        first_runs = [by_seed[r["seed"]] for r in arm_runs]
        for arm_run, first_run in zip(arm_runs, first_runs):
            delta, se, gained, lost = paired_difference(arm_run["final_items"], first_run["final_items"])
            lines.append(f"| {arm} | {arm_run['seed']} | {100 * arm_run['final_success']:.1f}% | "
                         f"{100 * first_run['final_success']:.1f}% | {100 * delta:+.1f} ({gained} / {lost}, "
                         f"{100 * se:.1f}) | {arm_run['wall_s'] / 60:.1f}, {first_run['wall_s'] / 60:.1f} min |")
        if len(arm_runs) > 1:  # each item averaged over the seeds, then the paired SE
            delta, se, _, _ = paired_difference(_mean_over_seeds(arm_runs, "final_items"),
                                                _mean_over_seeds(first_runs, "final_items"))
            lines.append(f"| **{arm}, mean** | {len(arm_runs)} | {100 * _mean(arm_runs, 'final_success'):.1f}% | "
                         f"{100 * _mean(first_runs, 'final_success'):.1f}% | **{100 * delta:+.1f}** (SE {100 * se:.1f}) "
                         f"| {_mean(arm_runs, 'wall_s') / 60:.1f}, {_mean(first_runs, 'wall_s') / 60:.1f} min |")
    return "\n".join(lines) if len(lines) > 2 else ""


def category_table(reports: dict[str, list[dict]], pass_k: int) -> str:
    """Markdown: per arm and category, greedy success after the warm-up and at the end, and
    Avg@k / Pass@k at temperature 1 of the final model, each the mean over the seeds."""
    lines = ["| arm | category | items | after warm-up | final |" + (f" Avg@{pass_k} / Pass@{pass_k} (T=1) |"
                                                                   if pass_k else ""),
             "|---|---|---|---|---|" + ("---|" if pass_k else "")]
    for arm, runs in reports.items():
        categories = runs[0]["categories"]
        for category in sorted(set(categories.values())):
            items = [i for i, c in categories.items() if c == category]
            cells = []
            for key in ("warmup_items", "final_items"):
                cells.append(sum(r[key][i] for r in runs for i in items) / (len(runs) * len(items)))
            row = f"| {arm} | {category} | {len(items)} | {100 * cells[0]:.1f}% | {100 * cells[1]:.1f}% |"
            if pass_k:
                avg, best = (sum(r[f"{kind}_at_{pass_k}_by_category"][category] for r in runs) / len(runs)
                             for kind in ("avg", "pass"))
                row += f" {100 * avg:.1f}% / {100 * best:.1f}% |"
            lines.append(row)
    return "\n".join(lines)


def plot(reports: dict[str, list[dict]], out: Path, target: float | None = None) -> Path:
    """Bars: each arm's success after the warm-up and at the end, mean over seeds, seeds as dots;
    `target` (%) a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(reports), 3.6))
    for index, (arm, runs) in enumerate(reports.items()):
        for offset, key, colour in ((-0.18, "warmup_success", "#9bb7d4"), (0.18, "final_success", "#2f6fad")):
            values = [100 * r[key] for r in runs]
            ax.bar(index + offset, sum(values) / len(values), width=0.34, color=colour,
                   label=("after warm-up" if key == "warmup_success" else "final") if index == 0 else None)
            ax.scatter([index + offset] * len(values), values, color="black", s=10, zorder=3)
    if target is not None:
        ax.axhline(target, color="#c0392b", linestyle="--", linewidth=1, label=f"target {target:g}%")
    ax.set_xticks(range(len(reports)), list(reports))
    ax.set_ylabel("greedy test success (%)")
    ax.set_ylim(0, 115)  # room above the bars for the legend
    ax.set_yticks(range(0, 101, 20))
    ax.legend(loc="upper center", ncol=3, frameon=False, fontsize="small")
    fig.tight_layout()
    path = out / "study.png"
    fig.savefig(path, dpi=120)
    return path


def _train_curve(run_dir: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row[key] for row in rows if key in row]


def curves(reports: dict[str, list[dict]], out: Path, window: int = 3) -> Path | None:
    """Lines: each arm's training success and mean turns per RL step, averaged over seeds and
    over `window` steps (one step is 32 episodes, too few to read alone); None without RL steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    drawn = False
    for arm, runs in reports.items():
        for ax, key, scale in ((axes[0], "train/success", 100), (axes[1], "train/turns", 1)):
            per_seed = [_train_curve(out / f"{arm}_s{r['seed']}", key) for r in runs]
            steps = min(len(c) for c in per_seed)
            if steps < window:
                continue
            mean = [scale * sum(c[i] for c in per_seed) / len(per_seed) for i in range(steps)]
            smooth = [sum(mean[i - window + 1:i + 1]) / window for i in range(window - 1, steps)]
            ax.plot(range(window, steps + 1), smooth, label=arm)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_ylabel(f"training success (%), mean of {window} steps")
    axes[1].set_ylabel("mean turns per episode")
    for ax in axes:
        ax.set_xlabel("RL step")
    axes[0].legend()
    fig.tight_layout()
    path = out / "study_curves.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plan(study: dict, seeds: list[int], out: Path, only: list[str] | None = None,
         extra: list[str] = ()) -> list[tuple[str, int, list[str]]]:
    """The runs of a study in order, as (arm, seed, overrides): arm by arm, `extra` put on each;
    with `warmup_from`, that arm first (also when `only` leaves it out: the others need its
    warm-ups) and `{warmup}` replaced by its run's warmup_model for the same seed."""
    arms = {name: [*(overrides or []), *extra] for name, overrides in study["arms"].items()
            if not only or name in only}
    shared = study.get("warmup_from")
    if shared is not None:
        if shared not in study["arms"]:
            raise SystemExit(f"warmup_from: {shared!r} is not one of the arms ({', '.join(study['arms'])})")
        arms = {shared: arms.pop(shared, [*(study["arms"][shared] or []), *extra]), **arms}
    return [(arm, seed, [o.replace("{warmup}", str(out / f"{shared}_s{seed}" / "warmup_model")) for o in overrides])
            for arm, overrides in arms.items() for seed in seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="the study YAML (config, seeds, arms)")
    parser.add_argument("--seeds", type=int, nargs="*", help="override the study's seeds")
    parser.add_argument("--arms", nargs="*", help="run only these arms")
    parser.add_argument("--out", default=None, help="folder of the runs (default runs/study_<name>)")
    parser.add_argument("--set", nargs="*", default=[], help="overrides put on every arm, e.g. model.path=DIR")
    parser.add_argument("--pass-k", type=int, help="override the study's pass_k (0: no Pass@k evaluation)")
    parser.add_argument("--listed-actions-only", action=argparse.BooleanOptionalAction, default=None,
                        help="override the study's listed_actions_only: also score each run's starting and final "
                             "model with replies restricted to the listed actions")
    args = parser.parse_args()
    study = yaml.safe_load(Path(args.study).read_text())
    seeds = args.seeds or study.get("seeds", [0])
    pass_k = args.pass_k if args.pass_k is not None else int(study.get("pass_k", 0))
    listed = args.listed_actions_only if args.listed_actions_only is not None else \
        bool(study.get("listed_actions_only", False))
    out = Path(args.out or f"runs/study_{Path(args.study).stem}").resolve()
    reports: dict[str, list[dict]] = {}
    for arm, seed, overrides in plan(study, seeds, out, args.arms, args.set):
        report = run_one(study["config"], overrides, seed, f"{arm}_s{seed}", out, pass_k, listed)
        reports.setdefault(arm, []).append(report)
        print(f"{arm} seed {seed}: {100 * report['warmup_success']:.1f}% -> {100 * report['final_success']:.1f}% "
              f"in {report['wall_s'] / 60:.1f} min", flush=True)
    text = "\n\n".join(part for part in (table(reports, pass_k, listed), versus_table(reports, study.get("versus")),
                                          category_table(reports, pass_k)) if part)
    (out / "study.md").write_text(text + "\n")
    print(text)
    print(f"plot: {plot(reports, out, study.get('target'))}")
    training = curves(reports, out)
    if training:
        print(f"training curves: {training}")


if __name__ == "__main__":
    main()
