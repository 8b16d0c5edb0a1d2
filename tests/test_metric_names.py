"""Metric names are declared once (`agentgym_rl.metric_names`): no other module, nor the viewer's
script, spells a `metrics.jsonl` key; every key a run logs is described; the viewer gets the
names from the server."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from agentgym_rl import metric_names as metric
from agentgym_rl.ui.app import create_app

SRC = Path(metric.__file__).parent
KEY = re.compile(r"^(train|val|update|adv|rollout|time|async|env|sample|sampling|sft|data|pairs|rewards)/([a-z_]|$)")
"""The start of a metrics.jsonl key: a group and a slash, then a name, or nothing (the literal part
of an f-string that adds the name)."""


def spelled_keys(path: Path) -> list[str]:
    """String constants of a module (f-strings' literal parts included) that start like a metric
    key, docstrings left out."""
    tree = ast.parse(path.read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [f"{path.name}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            and KEY.match(node.value)]


def test_no_module_but_metric_names_spells_a_metric_key(tmp_path):
    found = [hit for path in sorted(SRC.rglob("*.py")) if path.name != "metric_names.py"
             for hit in spelled_keys(path)]
    assert not found
    planted = tmp_path / "planted.py"  # the check itself finds one
    planted.write_text('"""A docstring naming train/success."""\nrow = {f"adv/{1}": 1, "val/success": 0}\n')
    assert len(spelled_keys(planted)) == 2


def test_the_viewers_script_spells_no_metric_key_and_gets_them_from_the_server(tmp_path):
    script = (SRC / "ui" / "static" / "app.js").read_text()
    assert not re.findall(r"[\"'`](train|val|update|adv|rollout|time)/", script)
    client = TestClient(create_app(tmp_path, allowed_hosts=["testserver"]))
    served = client.get("/api/metrics").json()
    assert served["preferred"] == [metric.TRAIN_SUCCESS, metric.VAL_SUCCESS]
    assert served["described"][metric.UPDATE_APPROX_KL].startswith("policy drift")


def described(key: str) -> bool:
    """Whether `key` has a description of its own, or is built from a name (a category, an
    environment) in a family that has one."""
    return (key in metric.DOCS or metric.env_of(key) is not None
            or key.startswith(("train/success/", "val/success/")))


def test_every_key_a_run_logs_is_described():
    golden = json.loads((Path(__file__).parent / "golden" / "fit_toy.json").read_text())
    keys = {key for run in golden.values() for row in run["metrics"] for key in row} - {"step"}
    assert {metric.TRAIN_SUCCESS, metric.UPDATE_LR, metric.VAL_SUCCESS} <= keys
    assert [key for key in sorted(keys) if not described(key)] == []
    assert not described("train/unheard_of") and not described("update/unheard_of")


def test_env_of_names_the_environment_of_a_mix_key_only():
    assert metric.env_of(metric.env_metric("train", "babyai", "success")) == "babyai"
    assert metric.env_of(metric.category_success("val", "GoTo")) is None
    assert metric.env_of(metric.TRAIN_SUCCESS) is None
