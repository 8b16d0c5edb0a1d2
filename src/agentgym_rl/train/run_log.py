"""Metrics of a run: one JSON line per step in `metrics.jsonl`, mirrored to TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends `{"step": s, **metrics}` lines; scalar metrics also go to TensorBoard.

    Args:
        run_dir: the run folder; writes `metrics.jsonl` and `tensorboard/` in it.
        tensorboard: set False to skip TensorBoard (e.g. in short-lived evaluations).
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after `step` (a resumed run re-logs them)."""
        if not self.path.exists():
            return
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        kept = [line for line in lines if json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
