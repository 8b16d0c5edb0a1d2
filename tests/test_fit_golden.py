"""`RLTrainer.fit` gives what it gave before its loop was restructured: two steps of the toy run,
synchronous and asynchronous, with validations and a checkpoint, against the metrics (but time/*)
and the final weights recorded from the code before the change (tests/golden/fit_toy.json).

Floats are compared to 1e-5 relative (the weights' sums to 1e-6 absolute too): the same code
on another CPU may round differently; a change of behaviour moves them far more.
`GOLDEN_WRITE=1 pytest tests/test_fit_golden.py` writes the file anew from the code as it is
(only when the behaviour is meant to change)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_run_safety import toy_config

from agentgym_rl.train.rl import RLTrainer

GOLDEN = Path(__file__).resolve().parent / "golden" / "fit_toy.json"
RUNS = {
    "synchronous": ["train.steps=2", "train.validate_every=1", "eval.episodes=3", "train.save_every=2"],
    "asynchronous": ["train.steps=2", "train.validate_every=1", "eval.episodes=3", "train.save_every=2",
                     "train.asynchronous=true", "rollout.max_staleness=1"],
}


def outcome(tmp_path: Path, name: str, overrides: list[str]) -> dict:
    """The run's metrics lines without their timings, and the sum of each weight tensor."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order, as the golden file was written with
    try:
        RLTrainer(toy_config(tmp_path, f"run.name={name}", "rollout.threads=1", *overrides), log=lambda _: None).fit()
    finally:
        torch.set_num_threads(threads)
    rows = [{key: value for key, value in json.loads(line).items() if not key.startswith("time/")}
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    weights = load_file(str(tmp_path / name / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    return {"metrics": rows, "weights": {key: float(tensor.double().sum()) for key, tensor in sorted(weights.items())}}


def assert_close(got, expected, where: str = "", abs_tol: float = 1e-7) -> None:
    if isinstance(expected, dict):
        assert set(got) == set(expected), f"{where}: keys {sorted(set(got) ^ set(expected))}"
        for key in expected:
            assert_close(got[key], expected[key], f"{where}/{key}", abs_tol)
    elif isinstance(expected, list):
        assert len(got) == len(expected), where
        for index, (a, b) in enumerate(zip(got, expected)):
            assert_close(a, b, f"{where}[{index}]", abs_tol)
    elif isinstance(expected, float):
        assert math.isclose(got, expected, rel_tol=1e-5, abs_tol=abs_tol), f"{where}: {got} != {expected}"
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


@pytest.mark.parametrize("name", list(RUNS))
def test_fit_gives_the_recorded_metrics_and_weights(tmp_path, counter_env_registered, name):
    got = outcome(tmp_path, name, RUNS[name])
    if os.environ.get("GOLDEN_WRITE"):
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({**recorded, name: got}, indent=1, sort_keys=True) + "\n")
    expected = json.loads(GOLDEN.read_text())[name]
    assert set(got) == set(expected) == {"metrics", "weights"}
    assert_close(got["metrics"], expected["metrics"], f"{name}/metrics")
    # A tensor's sum after two updates moved by up to 2.4e-7 on another CPU (an AMD EPYC: the key
    # bias, whose sum is 0.002, so 1e-4 relative); a change of behaviour moves sums far more.
    assert_close(got["weights"], expected["weights"], f"{name}/weights", abs_tol=1e-6)
