"""Where a run's scalars go besides `metrics.jsonl`: TensorBoard, Weights & Biases, MLflow.

`run.loggers` names them (TensorBoard alone by default). Each tracker takes the scalars of
every `metrics.jsonl` line at that line's step; the W&B and MLflow runs also hold the resolved
config. Weights & Biases and MLflow are the optional extra `agentgym-rl[loggers]`:

- **wandb**: a run in project `$WANDB_PROJECT` (default "agentgym-rl") named and grouped by the
  run's name, its files under the run folder's `wandb/`. `WANDB_MODE=offline` logs without an
  account (`wandb sync` uploads later).
- **mlflow**: a run in experiment `$MLFLOW_EXPERIMENT_NAME` (default "agentgym-rl") of the
  store `$MLFLOW_TRACKING_URI`, by default one SQLite file beside the run folders
  (`<run.output_dir>/mlflow.db`: `mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`).

A resumed run opens a new W&B or MLflow run ("NAME (resumed at step N)", the same W&B group):
neither can take back the steps after the checkpoint that `metrics.jsonl` drops.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from .errors import DISK_ERRORS, UserError

TRACKERS = ("tensorboard", "wandb", "mlflow")
_EXTRA = "pip install 'agentgym-rl[loggers]'"


_MODULES = {"wandb": "wandb", "mlflow": "mlflow"}
"""The package each logger other than TensorBoard imports."""


def check_installed(names: list[str] | tuple[str, ...]) -> None:
    """A `UserError` for a logger in `names` that is unknown or whose package is missing, without
    importing it: run before any work, so a run does not fail once its model is built."""
    import importlib.util

    unknown = sorted(set(names) - set(TRACKERS))
    if unknown:
        raise UserError(f"run.loggers: unknown logger(s) {', '.join(unknown)}; choose from {', '.join(TRACKERS)}")
    for name in dict.fromkeys(names):
        if name in _MODULES and importlib.util.find_spec(_MODULES[name]) is None:
            raise UserError(f"run.loggers names {name}, which is not installed: {_EXTRA}")


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def open_trackers(names: list[str] | tuple[str, ...], run_dir: Path, run_name: str, config: dict[str, Any],
                  resumed_at: int | None = None) -> list[Tracker]:
    """A tracker for each name in `names` (`TRACKERS`); `config` is the run's resolved config
    as nested dicts; `resumed_at` the checkpoint's step when the run is resumed."""
    check_installed(names)
    title = run_name if resumed_at is None else f"{run_name} (resumed at step {resumed_at})"
    opened: list[Tracker] = []
    try:
        for name in dict.fromkeys(names):
            if name == "tensorboard":
                opened.append(TensorBoard(run_dir))
            elif name == "wandb":
                opened.append(WandB(run_dir, title, run_name, config))
            else:
                opened.append(MLflow(run_dir, title, config))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics line (booleans, strings and lists are not plotted)."""
    return {key: float(value) for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


class TensorBoard:
    """`tensorboard/` in the run folder."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        _report_event_writer_disk_errors()
        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    """A Weights & Biases run (see the module's docstring)."""

    def __init__(self, run_dir: Path, title: str, group: str, config: dict[str, Any]):
        try:
            import wandb
        except ImportError:
            raise UserError(f"run.loggers names wandb, which is not installed: {_EXTRA}") from None
        self.wandb = wandb
        settings = wandb.Settings(silent=True, console="off")  # the run's console stays ours
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "agentgym-rl"), name=title, group=group,
                                  dir=str(run_dir), config=config, settings=settings)
        except Exception as error:  # no account, no network: wandb's own errors, one line each
            raise UserError(f"Weights & Biases could not start a run ({str(error).strip().splitlines()[0]}); "
                            "WANDB_MODE=offline logs into the run folder without an account") from None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MLflow:
    """An MLflow run (see the module's docstring), written through `MlflowClient` so that no
    process-wide active run is left behind."""

    def __init__(self, run_dir: Path, title: str, config: dict[str, Any]):
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise UserError(f"run.loggers names mlflow, which is not installed: {_EXTRA}") from None
        for name in ("mlflow", "alembic"):  # their INFO lines (creating tables...) would fill the run's console
            logging.getLogger(name).setLevel(logging.WARNING)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(run_dir).resolve().parent / 'mlflow.db'}"
        try:
            self.client = MlflowClient(tracking_uri=uri)
            experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "agentgym-rl")
            experiment = self.client.get_experiment_by_name(experiment_name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
            self.run_id = self.client.create_run(experiment_id, run_name=title,
                                                 tags={"run_dir": str(Path(run_dir).resolve())}).info.run_id
            params = [Param(key, str(value)[:6000]) for key, value in _flat(config).items()]
            for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[start:start + 100])
        except Exception as error:
            raise UserError(f"MLflow could not start a run in {uri} ({str(error).strip().splitlines()[0]})") from None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}: MLflow's params are flat."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _report_event_writer_disk_errors() -> None:
    """TensorBoard writes its event file in a thread of its own, which on a full or read-only
    disk dies with a traceback in the middle of the run's output. It is said in one line instead:
    the run's next metrics write meets the same error and stops the run with its own line."""
    previous = threading.excepthook
    if getattr(previous, "reports_event_writer_disk_errors", False):
        return

    def hook(args: Any) -> None:
        error = args.exc_value
        if (isinstance(error, OSError) and error.errno in DISK_ERRORS
                and type(args.thread).__name__ == "_AsyncWriterThread"):
            print(f"warning: TensorBoard could not write its event file ({error.strerror or error})", file=sys.stderr)
            return
        previous(args)

    hook.reports_event_writer_disk_errors = True  # type: ignore[attr-defined]
    threading.excepthook = hook
