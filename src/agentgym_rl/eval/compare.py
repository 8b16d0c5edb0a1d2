"""Comparing finished runs: validation success per step, averaged over seeds, as a table
and a plot. Reads run folders only (`metrics.jsonl`), so it works on any runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..runs import read_metrics


def validation_curve(run_dir: str | Path) -> dict[int, float]:
    """step → validation success of one run."""
    return {row["step"]: row["val/success"] for row in read_metrics(run_dir) if "val/success" in row}


def summarize_runs(runs: dict[str, list[Path]]) -> list[dict[str, Any]]:
    """One row per label: start and final validation success (mean and sample std over seeds),
    the change, and the best step's mean.

    Args:
        runs: label → run folders (one per seed) of that configuration.
    """
    rows = []
    for label, folders in runs.items():
        curves = [validation_curve(f) for f in folders]
        curves = [c for c in curves if c]
        if not curves:
            rows.append({"label": label, "seeds": 0})
            continue
        starts = [c[min(c)] for c in curves]
        finals = [c[max(c)] for c in curves]
        common = sorted(set.intersection(*(set(c) for c in curves)))
        means = {step: _mean([c[step] for c in curves]) for step in common}
        rows.append({
            "label": label, "seeds": len(curves), "final_step": max(curves[0]),
            "start": _mean(starts), "final": _mean(finals), "final_std": _std(finals),
            "change": _mean([f - s for f, s in zip(finals, starts)]),
            "best": max(means.values()) if means else float("nan"),
        })
    return rows


def format_comparison(rows: list[dict[str, Any]], episodes: int | None = None) -> str:
    """A Markdown table of `summarize_runs` rows (success in %)."""
    lines = ["| algorithm | seeds | start | final (mean ± std) | change | best step mean |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if not r["seeds"]:
            lines.append(f"| {r['label']} | 0 | – | – | – | – |")
            continue
        spread = "" if r["seeds"] < 2 else f" ± {100 * r['final_std']:.1f}"
        lines.append(f"| {r['label']} | {r['seeds']} | {100 * r['start']:.1f} | {100 * r['final']:.1f}{spread} "
                     f"| {100 * r['change']:+.1f} | {100 * r['best']:.1f} |")
    if episodes:
        lines.append(f"\nSuccess in % on {episodes} validation items; start = step 0, final = last validation.")
    return "\n".join(lines)


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
