"""`agentgym-rl compare`: the summary maths on hand-made runs, and the command end to end."""

from __future__ import annotations

import json

import pytest
from test_cli import run
from test_env_e2e import TINY_RUN
from test_train_e2e import REPO

from agentgym_rl.eval.compare import format_comparison, summarize_runs


def _fake_run(folder, curve):
    folder.mkdir(parents=True)
    rows = [{"step": step, "val/success": value} for step, value in curve.items()]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_summary_over_seeds(tmp_path):
    runs = {"a": [_fake_run(tmp_path / "a0", {0: 0.2, 2: 0.4}), _fake_run(tmp_path / "a1", {0: 0.2, 2: 0.6})],
            "b": [_fake_run(tmp_path / "b0", {0: 0.5, 2: 0.3, 4: 0.4})]}
    a, b = summarize_runs(runs)
    # a: finals 0.4 and 0.6 -> mean 0.5, sample std sqrt(((−0.1)² + 0.1²) / 1) = 0.1414
    assert a["final"] == pytest.approx(0.5) and a["final_std"] == pytest.approx(0.141421, abs=1e-6)
    assert a["change"] == pytest.approx(0.3) and a["best"] == pytest.approx(0.5) and a["seeds"] == 2
    assert b["start"] == 0.5 and b["final"] == 0.4 and b["change"] == pytest.approx(-0.1) and b["best"] == 0.5
    table = format_comparison([a, b], episodes=90)
    assert "| a | 2 | 20.0 | 50.0 ± 14.1 | +30.0 | 50.0 |" in table
    assert "| b | 1 | 50.0 | 40.0 | -10.0 | 50.0 |" in table


@pytest.mark.slow
def test_compare_command_trains_each_config_and_seed_once(tmp_path):
    args = ["compare", str(REPO / "configs" / "babyai_grpo.yaml"), str(REPO / "configs" / "babyai_rloo.yaml"),
            *TINY_RUN, "train.steps=1", "--seeds", "0,1", "--out", str(tmp_path),
            "--set", "train.validate_every=1"]  # bare overrides as train takes them; --set still works
    result = run(*args)
    assert "--set is deprecated" in result.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "comparison.md").read_text()
    assert "| babyai_grpo | 2 |" in table and "| babyai_rloo | 2 |" in table
    assert (tmp_path / "comparison.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "babyai_grpo_s0", "babyai_grpo_s1", "babyai_rloo_s0", "babyai_rloo_s1"]
    again = run(*args)
    assert again.returncode == 0 and again.stdout.count("already complete") == 4


def test_compare_rejects_bad_input(tmp_path):
    result = run("compare", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "does not exist" in result.stderr
    result = run("compare", str(REPO / "configs" / "babyai_grpo.yaml"), "--seeds", "a,b")
    assert result.returncode == 2 and "--seeds" in result.stderr
    result = run("compare", "train.steps=1")
    assert result.returncode == 2 and "at least one config file" in result.stderr
