"""Comparing finished runs: validation success per step, averaged over seeds, as a table
and a plot, and the first validation against the last item by item where the runs kept their
episodes. Reads run folders only (`metrics.jsonl`, `validation/`), so it works on any runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..rollout.trajectory import load_trajectories
from ..runs import read_metrics
from .metrics import item_success, paired_difference
from .. import metric_names as metric


def validation_curve(run_dir: str | Path) -> dict[int, float]:
    """step → validation success of one run."""
    return {row["step"]: row[metric.VAL_SUCCESS] for row in read_metrics(run_dir) if metric.VAL_SUCCESS in row}


def first_and_last_items(run_dir: str | Path) -> tuple[dict[str, float], dict[str, float]] | None:
    """Each item's success in a run's first and last validation (`validation/step_*.jsonl`,
    written when `train.save_trajectories` is on), or None without two validations of the same
    items."""
    files = sorted((Path(run_dir) / "validation").glob("step_*.jsonl"))
    if len(files) < 2:
        return None
    first, last = (item_success(load_trajectories(path)) for path in (files[0], files[-1]))
    return (first, last) if set(first) == set(last) else None


def paired_change(pairs: list[tuple[dict[str, float], dict[str, float]] | None]) -> dict[str, Any] | None:
    """The first validation against the last over the same items, seeds averaged item by item
    (`paired_difference` of the per-item means): the change, its paired standard error, the
    items that gained and lost, and how many items. None unless every run has both validations
    (`first_and_last_items`, one pair a run) of one shared set of items.

    With greedy validation every seed starts from the same step-0 results, so averaging the
    seeds per item keeps the pairing: the error counts item-to-item spread, not seed noise alone.
    """
    if not pairs or any(p is None for p in pairs) or len({frozenset(p[0]) for p in pairs}) != 1:
        return None
    items = sorted(pairs[0][0])
    before = {i: sum(p[0][i] for p in pairs) / len(pairs) for i in items}
    after = {i: sum(p[1][i] for p in pairs) / len(pairs) for i in items}
    delta, error, gained, lost = paired_difference(before, after)
    return {"change": delta, "error": error, "gained": gained, "lost": lost, "items": len(items)}


def summarize_runs(runs: dict[str, list[Path]]) -> list[dict[str, Any]]:
    """One row per label: start and final validation success (mean and sample std over seeds;
    each seed's first and last validation, "final_steps" the steps of the last ones, which
    differ when a seed stopped early), the change, the best mean over the steps every seed
    validated, the change item by item (`paired_change`, None without
    validation episodes) and, under "each", one such row per run that has them (its name, first
    and last success, its own `paired_change`).

    Args:
        runs: label → run folders (one per seed) of that configuration.
    """
    rows = []
    for label, folders in runs.items():
        curves = [validation_curve(f) for f in folders]
        curves = [c for c in curves if c]
        if not curves:
            rows.append({"label": label, "seeds": 0, "each": []})
            continue
        starts = [c[min(c)] for c in curves]
        finals = [c[max(c)] for c in curves]
        common = sorted(set.intersection(*(set(c) for c in curves)))
        means = {step: _mean([c[step] for c in curves]) for step in common}
        pairs = [first_and_last_items(f) for f in folders]  # each run's validation files read once
        each = [{"run": Path(folder).name, "start": _mean(list(pair[0].values())),
                 "final": _mean(list(pair[1].values())), **paired_change([pair])}
                for folder, pair in zip(folders, pairs) if pair is not None]
        rows.append({
            "label": label, "seeds": len(curves), "final_steps": sorted({max(c) for c in curves}),
            "start": _mean(starts), "final": _mean(finals), "final_std": _std(finals),
            "change": _mean([f - s for f, s in zip(finals, starts)]),
            "best": max(means.values()) if means else float("nan"),
            "paired": paired_change(pairs), "each": each,
        })
    return rows


def format_comparison(rows: list[dict[str, Any]], episodes: int | None = None) -> str:
    """A Markdown table of `summarize_runs` rows (success in %)."""
    lines = ["| algorithm | seeds | start | final (mean ± std) | change | paired SE | best step mean |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["seeds"]:
            lines.append(f"| {r['label']} | 0 | – | – | – | – | – |")
            continue
        spread = "" if r["seeds"] < 2 else f" ± {100 * r['final_std']:.1f}"
        if len(r["final_steps"]) > 1:  # a seed stopped early: its last validation is another step's
            spread += f" (last steps {', '.join(map(str, r['final_steps']))})"
        paired = r.get("paired")
        error = "–" if paired is None else _points(paired["error"])
        lines.append(f"| {r['label']} | {r['seeds']} | {100 * r['start']:.1f} | {100 * r['final']:.1f}{spread} "
                     f"| {100 * r['change']:+.1f} | {error} | {100 * r['best']:.1f} |")
    if episodes:
        lines.append(f"\nSuccess in % on {episodes} validation items; start = step 0, final = each seed's last "
                     "validation (their steps named where they differ); paired SE: the change's standard error "
                     "over the items, seeds averaged item by item; best step mean: over the steps every seed "
                     "validated.")
    return "\n".join(lines)


def format_each_run(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the runs under the "each" of `summarize_runs` rows (success in %), or
    "" without any."""
    each = [run for r in rows for run in r.get("each", [])]
    if not each:
        return ""
    lines = ["| run | start | final | change | items gained | items lost | paired SE |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {100 * r['start']:.1f} | {100 * r['final']:.1f} | {100 * r['change']:+.1f} "
              f"| {r['gained']} | {r['lost']} | {_points(r['error'])} |" for r in each]
    return "\n".join(lines)


def _points(error: float) -> str:
    """A standard error in points, "–" where one item gives none (NaN)."""
    return "–" if math.isnan(error) else f"{100 * error:.1f}"


def plot_comparison(runs: dict[str, list[Path]], out: str | Path) -> Path:
    """Validation success vs step, one line per label (mean over seeds, band = min..max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, folders in runs.items():
        curves = [c for c in (validation_curve(f) for f in folders) if c]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        values = [[c[s] for c in curves] for s in steps]
        line, = ax.plot(steps, [_mean(v) for v in values], "o-", label=f"{label} ({len(curves)} seeds)")
        if len(curves) > 1:
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=line.get_color(),
                            alpha=0.15)
    ax.set_xlabel("RL step")
    ax.set_ylabel("validation success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.lines:  # no run has a validation yet (all failed early): an empty plot, no legend
        ax.legend()
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
