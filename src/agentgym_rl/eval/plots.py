"""Plots of a run folder's `metrics.jsonl` (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path

from ..runs import read_metrics


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    picked = [(r["step"], r[key]) for r in rows if key in r]
    return [s for s, _ in picked], [v for _, v in picked]


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and the up to `window - 1` values before it.

    A step's training success averages only a few groups (the quickstart: 8 tasks), so its
    curve jumps by tenths from step to step; this is the trend drawn over it.
    [1, 0, 1, 1] with window 2 gives [1, 0.5, 0.5, 1].
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def smoothing_window(steps: int) -> int:
    """A tenth of the run, from 1 (no smoothing) to 20 steps."""
    return max(1, min(20, steps // 10))


def plot_run(run_dir: str | Path) -> Path:
    """Write `report/training.png`: training success and reward per step (each step's value
    faint, their trailing mean over a tenth of the run bold), validation success, the horizon
    schedule and the turns used. Returns the image path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run_dir)
    rows = read_metrics(run)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    steps, success = _series(rows, "train/success")
    window = smoothing_window(len(steps))
    mean_label = f" (mean of {window} steps)" if window > 1 else ""
    top.plot(steps, success, color="tab:blue", alpha=0.25, linewidth=1)
    top.plot(steps, trailing_mean(success, window), color="tab:blue", linewidth=2,
             label=f"train success{mean_label}")
    steps_r, reward = _series(rows, "train/reward")
    top.plot(steps_r, trailing_mean(reward, window), color="tab:orange", linewidth=1.5, linestyle="--",
             label=f"train reward{mean_label}")
    val_steps, val_success = _series(rows, "val/success")
    if val_steps:
        top.plot(val_steps, val_success, "o-", label="validation success", color="tab:green")
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("fraction / reward")
    top.legend(loc="upper left", fontsize="small")
    top.grid(alpha=0.3)
    h_steps, horizon = _series(rows, "horizon")
    bottom.step(h_steps, horizon, where="post", color="tab:red", label="horizon (max turns)")
    turn_steps, turns = _series(rows, "train/turns")
    bottom.plot(turn_steps, turns, color="tab:purple", alpha=0.25, linewidth=1)
    bottom.plot(turn_steps, trailing_mean(turns, window), color="tab:purple", linewidth=2,
                label=f"mean turns used{mean_label}")
    bottom.set_xlabel("RL step")
    bottom.set_ylabel("turns")
    bottom.legend(loc="lower right", fontsize="small")
    bottom.grid(alpha=0.3)
    fig.suptitle(f"{run.name}: ScalingInter-RL training")
    fig.tight_layout()
    out = run / "report" / "training.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
