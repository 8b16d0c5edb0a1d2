"""Weights & Biases (offline) and MLflow (a local SQLite store) hold what `metrics.jsonl` holds."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from agentgym_rl.errors import UserError
from agentgym_rl.trackers import _flat, open_trackers, scalars

REPO = Path(__file__).resolve().parent.parent
TINY_COUNTER = [
    "env.id=counter", "env.kwargs={}", "warmup.episodes=0", "model.corpus_episodes=6", "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320", "algo.tasks_per_step=2", "algo.group_size=3",
    "algo.minibatch_size=4", "rollout.max_new_tokens=8", "schedule.horizons=[2]", "eval.episodes=2",
    "train.steps=2", "train.validate_every=1", "train.save_every=2", "optim.micro_batch_size=2",
]


def test_scalars_keep_numbers_only_and_the_config_is_flattened():
    assert scalars({"a": 1, "b": 0.5, "ok": True, "name": "x", "list": [1]}) == {"a": 1.0, "b": 0.5}
    assert _flat({"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "kwargs": {}, "seed": 0}) == {
        "optim.lr": 0.1, "optim.betas": [0.9, 0.99], "kwargs": {}, "seed": 0}


def test_an_unknown_or_missing_tracker_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="unknown logger.*neptune"):
        open_trackers(["neptune"], tmp_path, "r", {})
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # as if not installed
    with pytest.raises(UserError, match=r"wandb, which is not installed: pip install 'agentgym-rl\[loggers\]'"):
        open_trackers(["wandb"], tmp_path, "r", {})


def _wandb_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """The history rows of the offline W&B run under `run_dir/wandb/`, by step. Its `.wandb`
    file is a log of protobuf records in LevelDB's log format (32 KiB blocks, each record a
    7-byte header: checksum, length, kind)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    position, pending, rows = 7, b"", {}
    while position + 7 <= len(raw):
        left = 32768 - position % 32768
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[position:position + 7])
        if kind == 0:
            break
        pending += raw[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                rows.setdefault(int(items["_step"]), {}).update(
                    {k: v for k, v in items.items() if not k.startswith("_")})
    return rows


def test_wandb_and_mlflow_hold_the_scalars_of_metrics_jsonl(tmp_path, monkeypatch, counter_env_registered):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train.rl import RLTrainer

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # nothing of W&B's or MLflow's lands outside the run's folders
    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [
        *TINY_COUNTER, f"run.output_dir={tmp_path / 'runs'}", "run.name=tracked",
        "run.loggers=[tensorboard, wandb, mlflow]", "algo.skip_zero_advantage=false"])  # an update, tied or not
    RLTrainer(config, log=lambda _: None).fit()
    run_dir = tmp_path / "runs" / "tracked"

    expected: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        expected.setdefault(row.pop("step"), {}).update(scalars(row))
    assert sorted(expected) == [0, 1, 2] and "update/loss" in expected[1] and "val/success" in expected[2]

    history = _wandb_history(run_dir)
    assert sorted(history) == [0, 1, 2]
    for step, values in expected.items():
        assert history[step] == pytest.approx(values), step

    assert (tmp_path / "runs" / "mlflow.db").is_file()  # the default store, beside the run folders
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "agentgym-rl"]
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    assert mlflow_run.info.run_name == "tracked" and mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["optim.lr"] == str(config.optim.lr)
    logged: dict[int, dict[str, float]] = {}
    for key in mlflow_run.data.metrics:
        for point in client.get_metric_history(mlflow_run.info.run_id, key):
            logged.setdefault(point.step, {})[key] = point.value
    assert logged == {step: pytest.approx(values) for step, values in expected.items()}
