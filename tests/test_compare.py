"""`agentgym-rl compare`: the summary maths on hand-made runs, and the command end to end."""

from __future__ import annotations

import json

import pytest
from test_cli import run
from test_env_e2e import TINY_RUN
from test_train_e2e import REPO

from agentgym_rl.eval.compare import format_comparison, format_each_run, summarize_runs
from agentgym_rl.rollout.trajectory import Trajectory, save_trajectories


def _write_metrics(folder, rows):
    """`folder/metrics.jsonl` holding `rows`, the folder made if missing."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _fake_run(folder, curve, items=None):
    """A run folder with a validation curve and, given `items` (step → per-item successes),
    its validation episodes."""
    _write_metrics(folder, [{"step": step, "val/success": value} for step, value in curve.items()])
    for step, successes in (items or {}).items():
        episodes = [Trajectory("babyai", f"babyai_{i}", "GoTo", success=s) for i, s in enumerate(successes)]
        save_trajectories(episodes, folder / "validation" / f"step_{step:06d}.jsonl")
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
    assert "| a | 2 | 20.0 | 50.0 ± 14.1 | +30.0 | – | 50.0 |" in table  # no validation episodes: no pairs
    assert "| b | 1 | 50.0 | 40.0 | -10.0 | – | 50.0 |" in table
    # A seed stopped early: its last validation (step 2) is averaged with another's (step 4), and said.
    runs["b"].append(_fake_run(tmp_path / "b1", {0: 0.5, 2: 0.1}))
    b = summarize_runs(runs)[1]
    assert b["final_steps"] == [2, 4] and b["final"] == pytest.approx(0.25) and b["best"] == 0.5
    assert "| b | 2 | 50.0 | 25.0 ± 21.2 (last steps 2, 4) | -25.0 | – | 50.0 |" in format_comparison([b])


def test_paired_change_averages_the_seeds_item_by_item(tmp_path):
    start = [1, 0, 0, 0]  # greedy: every seed's step 0 is the same
    runs = {"a": [_fake_run(tmp_path / "a_s0", {0: 0.25, 2: 0.5}, {0: start, 2: [1, 1, 0, 0]}),
                  _fake_run(tmp_path / "a_s1", {0: 0.25, 2: 0.5}, {0: start, 2: [0, 1, 1, 0]})]}
    (row,) = summarize_runs(runs)
    # per item, after averaged over seeds: 0.5, 1, 0.5, 0 -> differences -0.5, 1, 0.5, 0: mean 0.25,
    # sample variance (0.75² + 0.75² + 0.25² + 0.25²) / 3 = 0.41667, SE sqrt(0.41667 / 4) = 0.32275
    assert row["paired"]["change"] == pytest.approx(0.25) and row["paired"]["error"] == pytest.approx(0.32275, abs=1e-5)
    assert (row["paired"]["gained"], row["paired"]["lost"], row["paired"]["items"]) == (2, 1, 4)
    assert "| a | 2 | 25.0 | 50.0 ± 0.0 | +25.0 | 32.3 | 50.0 |" in format_comparison([row])
    s0, s1 = row["each"]
    # s0: differences 0, 1, 0, 0 -> mean 0.25, variance (3 · 0.25² + 0.75²) / 3 = 0.25, SE 0.25;
    # s1: -1, 1, 1, 0 -> mean 0.25, variance (1.25² + 2 · 0.75² + 0.25²) / 3 = 0.91667, SE 0.47871
    assert s0["error"] == pytest.approx(0.25) and s1["error"] == pytest.approx(0.47871, abs=1e-5)
    each = format_each_run([row])
    assert "| a_s0 | 25.0 | 50.0 | +25.0 | 1 | 0 | 25.0 |" in each
    assert "| a_s1 | 25.0 | 50.0 | +25.0 | 2 | 1 | 47.9 |" in each
    # a seed validated on other items cannot be paired with the rest
    runs["a"].append(_fake_run(tmp_path / "a_s2", {0: 0.0, 2: 0.0}, {0: [0, 0], 2: [0, 0]}))
    assert summarize_runs(runs)[0]["paired"] is None


@pytest.mark.slow
def test_compare_command_trains_each_config_and_seed_once(tmp_path):
    args = ["compare", str(REPO / "configs" / "babyai_grpo.yaml"), str(REPO / "configs" / "babyai_rloo.yaml"),
            *TINY_RUN, "train.steps=1", "--out", str(tmp_path),
            "--set", "train.validate_every=1"]  # bare overrides as train takes them; --set still works
    result = run(*args, "--seeds", "0")  # in this process
    assert "--set is deprecated" in result.stderr
    assert result.returncode == 0, result.stderr[-3000:]
    # seed 0 is done; seed 1 trains in two processes at once
    again = run(*args, "--seeds", "0,1", "--jobs", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already complete") == 2 and again.stdout.count("in process") == 2
    table = (tmp_path / "comparison.md").read_text()
    assert "| babyai_grpo | 2 |" in table and "| babyai_rloo | 2 |" in table
    for name in ["babyai_grpo_s0", "babyai_grpo_s1", "babyai_rloo_s0", "babyai_rloo_s1"]:
        assert f"| {name} |" in table  # validated at steps 0 and 1: paired per run
    assert (tmp_path / "comparison.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "babyai_grpo_s0", "babyai_grpo_s1", "babyai_rloo_s0", "babyai_rloo_s1"]
    assert "step 1" in (tmp_path / "babyai_rloo_s1.log").read_text()  # the process's console


def test_compare_names_the_runs_that_failed_in_their_processes(tmp_path):
    result = run("compare", str(REPO / "configs" / "babyai_grpo.yaml"), *TINY_RUN, f"model.path={tmp_path / 'none'}",
                 "--seeds", "0,1", "--jobs", "2", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: 2 of 2 runs failed: babyai_grpo_s0 (exit 2: error: ") and "none" in error
    assert str(tmp_path / "out" / "babyai_grpo_s1.log") in error


def test_compare_rejects_bad_input(tmp_path):
    result = run("compare", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2 and "does not exist" in result.stderr
    result = run("compare", str(REPO / "configs" / "babyai_grpo.yaml"), "--seeds", "a,b")
    assert result.returncode == 2 and "--seeds" in result.stderr
    result = run("compare", "train.steps=1")
    assert result.returncode == 2 and "at least one config file" in result.stderr
    result = run("compare", str(REPO / "configs" / "babyai_grpo.yaml"), "--jobs", "0")
    assert result.returncode == 2 and "--jobs must be at least 1" in result.stderr


def test_a_run_without_checkpoints_counts_as_complete_by_its_metrics(tmp_path, monkeypatch):
    """With train.save_every=0 a finished run is known by its metrics (its last step trained and
    validated); an unfinished one cannot be resumed, so a restarted comparison trains it afresh
    over its folder instead of stopping on "already holds a run"."""
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train import compare

    overrides = ["train.steps=2", "train.validate_every=2", "train.save_every=0", f"run.output_dir={tmp_path}",
                 "run.name=r"]
    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", overrides)
    assert compare.run_state(config) == "afresh"
    rows = [{"step": 0, "val/success": 0.1}, {"step": 1, "train/success": 0.2}, {"step": 2, "train/success": 0.3}]
    _write_metrics(config.run.dir, rows)
    assert compare.run_state(config) == "afresh"  # stopped during its last validation
    trained = []

    class Trainer:
        def __init__(self, config, log):
            self.config = config

        def fit(self, resume):
            trained.append((self.config.run.name, self.config.run.overwrite, resume))

    monkeypatch.setattr(compare, "RLTrainer", Trainer)
    lines = []
    compare.run_comparison([REPO / "configs" / "babyai_grpo.yaml"], [0], overrides[:3], tmp_path, log=lines.append)
    assert trained == [("babyai_grpo_s0", False, False)]  # nothing there yet
    _write_metrics(tmp_path / "babyai_grpo_s0", rows[:2])
    compare.run_comparison([REPO / "configs" / "babyai_grpo.yaml"], [0], overrides[:3], tmp_path, log=lines.append)
    assert trained[-1] == ("babyai_grpo_s0", True, False)
    assert any("unfinished, without a checkpoint to go on from: trained afresh" in line for line in lines)
    _write_metrics(config.run.dir, [*rows, {"step": 2, "val/success": 0.4}])
    assert compare.run_state(config) == "complete"
    longer = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [*overrides, "train.steps=4"])
    assert compare.run_state(longer) == "afresh"
