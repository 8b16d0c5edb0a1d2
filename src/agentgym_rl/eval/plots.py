"""Plots of a run folder's `metrics.jsonl` (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path

from ..train.run_log import read_metrics


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    picked = [(r["step"], r[key]) for r in rows if key in r]
    return [s for s, _ in picked], [v for _, v in picked]


def plot_run(run_dir: str | Path) -> Path:
    """Write `report/training.png`: success and reward per step, validation success and the
    horizon schedule. Returns the image path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run_dir)
    rows = read_metrics(run)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    steps, success = _series(rows, "train/success")
    top.plot(steps, success, label="train success (rollouts)", color="tab:blue", alpha=0.6)
    val_steps, val_success = _series(rows, "val/success")
    if val_steps:
        top.plot(val_steps, val_success, "o-", label="validation success", color="tab:green")
    steps_r, reward = _series(rows, "train/reward")
    top.plot(steps_r, reward, label="train reward", color="tab:orange", alpha=0.6)
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("fraction / reward")
    top.legend(loc="lower right")
    top.grid(alpha=0.3)
    h_steps, horizon = _series(rows, "horizon")
    bottom.step(h_steps, horizon, where="post", color="tab:red", label="horizon (max turns)")
    turn_steps, turns = _series(rows, "train/turns")
    bottom.plot(turn_steps, turns, color="tab:purple", alpha=0.6, label="mean turns used")
    bottom.set_xlabel("RL step")
    bottom.set_ylabel("turns")
    bottom.legend(loc="upper left")
    bottom.grid(alpha=0.3)
    fig.suptitle(f"{run.name}: ScalingInter-RL training")
    fig.tight_layout()
    out = run / "report" / "training.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
