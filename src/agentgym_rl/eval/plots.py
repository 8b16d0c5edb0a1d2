"""Plots of a run folder's `metrics.jsonl` (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..runs import read_metrics
from .. import metric_names as metric


MARKED_POINTS = 30
"""Curves of at most this many steps get a marker at each step (a one-step run: a visible point)."""


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


def run_title(run_dir: Path, rows: list[dict]) -> str:
    """The plot's title: the run's name, algorithm and horizon schedule, read from its
    `config.yaml` (without one, the horizons its steps logged)."""
    import yaml

    path = run_dir / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.is_file() else None
    config = config if isinstance(config, dict) else {}
    schedule = config.get("schedule") if isinstance(config.get("schedule"), dict) else {}
    horizons = schedule.get("horizons") or list(dict.fromkeys(_series(rows, metric.HORIZON)[1]))
    if schedule.get("kind", "stepwise") == "stepwise" and len(horizons) > 1:
        every = f" every {schedule['every']} steps" if schedule.get("every") else ""
        horizon = "ScalingInter-RL horizons " + " → ".join(map(str, horizons)) + every
    else:
        horizon = f"fixed horizon {horizons[0]}" if horizons else "no step logged"
    algorithm = (config.get("algo") or {}).get("name") if isinstance(config.get("algo"), dict) else None
    return f"{run_dir.name}: " + ", ".join(part for part in (algorithm, horizon) if part)


def plot_run(run_dir: str | Path) -> Path:
    """Write `report/training.png` (`training_figure` of the run's metrics). Returns its path."""
    run = Path(run_dir)
    rows = read_metrics(run)
    fig = training_figure(rows, run_title(run, rows))
    import matplotlib.pyplot as plt  # after training_figure chose the Agg backend

    out = run / "report" / "training.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def mixed_envs(rows: list[dict]) -> list[str]:
    """The environments of a mix run, from its per-environment metrics (`train/env/<id>/...`,
    `val/env/<id>/...`), in the order they first appear; [] for a run of one environment."""
    found: dict[str, None] = {}
    for row in rows:
        for key in row:
            env_id = metric.env_of(key)
            if env_id is not None:
                found.setdefault(env_id, None)
    return list(found)


class _Trend:
    """Draws a metric over the steps of `rows`: each step's value faint, the trailing mean over
    `window` steps bold, a marker at each step of a short run."""

    def __init__(self, rows: list[dict], window: int):
        self.rows, self.window = rows, window
        self.suffix = f" (mean of {window} steps)" if window > 1 else ""

    def __call__(self, ax: Any, key: str, color: str, label: str, **style: Any) -> bool:
        """False when `key` was never logged (nothing drawn)."""
        steps, values = _series(self.rows, key)
        if not steps:
            return False
        if self.window > 1:
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
        marks = {"marker": "o", "markersize": 3} if len(steps) <= MARKED_POINTS else {}  # one step: a point
        ax.plot(steps, trailing_mean(values, self.window), color=color, label=label + self.suffix,
                **{"linewidth": 2, **marks, **style})
        return True


def _success_panel(ax: Any, rows: list[dict], trend: _Trend) -> None:
    trend(ax, metric.TRAIN_SUCCESS, "tab:blue", "train success")
    trend(ax, metric.TRAIN_REWARD, "tab:orange", "train reward", linestyle="--")
    val_steps, val_success = _series(rows, metric.VAL_SUCCESS)
    if val_steps:
        ax.plot(val_steps, val_success, "o-", label="validation success", color="tab:green")
    # A mix of environments: each one's training success (thin) and validation (hollow markers).
    for env_id, color in zip(mixed_envs(rows), ("tab:cyan", "tab:pink", "tab:olive", "tab:gray", "tab:brown")):
        trend(ax, metric.env_metric("train", env_id, "success"), color, f"train success: {env_id}", linewidth=1.2)
        env_steps, env_success = _series(rows, metric.env_metric("val", env_id, "success"))
        if env_steps:
            ax.plot(env_steps, env_success, "o--", color=color, markerfacecolor="none", label=f"validation: {env_id}")
    lowest = min(_series(rows, metric.TRAIN_REWARD)[1], default=0.0)  # rewards go below 0 with penalties
    ax.set_ylim(min(-0.03, lowest - 0.05), 1.03)
    ax.set_ylabel("fraction / reward")
    ax.set_title("success", fontsize="medium")


def _horizon_panel(ax: Any, rows: list[dict], trend: _Trend) -> None:
    trend(ax, metric.TRAIN_TURNS, "tab:purple", "mean turns used")
    # Drawn after the turns and dashed: the turns used often sit on the horizon.
    h_steps, horizon = _series(rows, metric.HORIZON)
    marks = {"marker": "_", "markersize": 10} if len(h_steps) <= MARKED_POINTS else {}
    ax.step(h_steps, horizon, where="post", color="tab:red", linestyle="--", linewidth=1.8, zorder=3,
            label="horizon (max turns)", **marks)
    highest = max([*horizon, *_series(rows, metric.TRAIN_TURNS)[1]], default=1)
    ax.set_ylim(0, highest * 1.15 + 0.5)  # room above the horizon: a line on the frame is lost
    ax.set_ylabel("turns")
    ax.set_title("interaction horizon", fontsize="medium")


def _loss_panel(ax: Any, trend: _Trend) -> None:
    if not trend(ax, metric.UPDATE_LOSS, "tab:brown", "loss"):
        ax.text(0.5, 0.5, "no update logged yet", transform=ax.transAxes, ha="center", color="grey")
    ax.set_ylabel("loss")
    ax.set_title("loss", fontsize="medium")


def _kl_panel(ax: Any, trend: _Trend) -> Any:
    """The KLs on `ax` and the entropy on a twin axis, which it returns."""
    trend(ax, metric.UPDATE_APPROX_KL, "tab:cyan", "policy drift: KL to the sampling policy")
    trend(ax, metric.UPDATE_KL, "tab:olive", "KL to the reference")
    ax.set_ylabel("KL")
    entropy_ax = ax.twinx()
    if trend(entropy_ax, metric.UPDATE_ENTROPY, "tab:gray", "entropy", linestyle=":"):
        entropy_ax.set_ylabel("entropy (nats)")
    else:
        entropy_ax.set_yticks([])
        ax.text(0.98, 0.95, "no update logged yet", transform=ax.transAxes, ha="right", va="top", fontsize="small",
                color="grey")
    ax.set_title("KL and entropy", fontsize="medium")
    return entropy_ax


def training_figure(rows: list[dict], title: str) -> Any:
    """Four panels over the RL steps of `metrics.jsonl` rows: success (training, each step's
    value faint and their trailing mean over a tenth of the run bold, and validation), turns
    (the horizon schedule and the turns used), the loss, and the policy's KL (to the sampling
    policy, and to the reference when the run has one) with its entropy when logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (success_ax, turns_ax), (loss_ax, kl_ax) = axes
    trend = _Trend(rows, smoothing_window(len(_series(rows, metric.TRAIN_SUCCESS)[0])))
    _success_panel(success_ax, rows, trend)
    _horizon_panel(turns_ax, rows, trend)
    _loss_panel(loss_ax, trend)
    entropy_ax = _kl_panel(kl_ax, trend)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        handles, labels = ax.get_legend_handles_labels()
        if ax is kl_ax:
            more = entropy_ax.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        if handles:
            ax.legend(handles, labels, loc="best", fontsize="small")
    for ax in axes[1]:
        ax.set_xlabel("RL step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
