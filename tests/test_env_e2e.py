"""TextCraft, Web and SciWorld end to end through the CLI with the tiny model: collect expert
episodes, train one RL step from scratch with the env's recipe (`configs/<env>_grpo.yaml`) on a
tiny budget, evaluate the checkpoint.

Each SciWorld environment instance starts its own JVM (seconds each on a busy 2-core
machine), so the runs are as small as the commands allow: 1 corpus episode, 2 tasks × 2
samples of 2 turns, validation on 2 items at step 0 only, 2 evaluation episodes, one instance
per engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_cli import cli

from agentgym_rl.agent.loading import load_model_and_tokenizer

REPO = Path(__file__).resolve().parent.parent

TINY_RUN = [
    "env.kwargs={}", "model.corpus_episodes=1", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
    "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=320", "warmup.episodes=0", "algo.tasks_per_step=2", "algo.group_size=2",
    "algo.minibatch_size=4", "optim.micro_batch_size=4", "rollout.max_new_tokens=8", "rollout.max_envs=2",
    "schedule.horizons=[2]", "train.steps=1", "train.save_every=1",
    # validate_every > steps: validation runs at step 0 and after the last step.
    "train.validate_every=2", "eval.episodes=2", "eval.max_turns=2",
]


@pytest.mark.parametrize("env_id", ["textcraft", "web", pytest.param("sciworld", marks=pytest.mark.slow)])
def test_collect_train_eval(tmp_path, capsys, monkeypatch, env_id):
    demos = tmp_path / "demos.jsonl"
    collected = 1 if env_id == "sciworld" else 2  # a SciWorld expert episode is ~40 turns of the JVM
    code, out, err = cli("collect", "--env", env_id, "--policy", "expert",
                         "--episodes", str(collected), "--out", str(demos))
    assert code == 0, err[-3000:]
    records = [json.loads(line) for line in demos.read_text().splitlines()]
    assert len(records) == collected and all(r["success"] for r in records)
    assert all(len(r["conversations"]) > 2 for r in records)

    # The env's own recipe, cut to a tiny budget (its env arguments kept). SciWorld plays its
    # 2-turn episodes on one instance per engine: each more starts a JVM (2 s on a quiet machine).
    one_env = ["rollout.max_envs=1"] if env_id == "sciworld" else []
    tiny = [override for override in TINY_RUN if not override.startswith("env.kwargs")] + one_env
    code, out, err = cli("train", str(REPO / "configs" / f"{env_id}_grpo.yaml"), *tiny,
                         f"run.output_dir={tmp_path}", "run.name=run")
    assert code == 0, err[-3000:]
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "val/success" in r) for r in rows] == [(0, True), (1, False), (1, True)]
    step = rows[1]
    # The engine records an env exception as an episode error, so a broken env shows here.
    assert step["train/errors"] == 0 and 1 <= step["train/turns"] <= 2
    trajectories = (run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    assert len(trajectories) == 4 and all(json.loads(t)["env_id"] == env_id for t in trajectories)
    model_dir = run_dir / "checkpoints" / "step_000001" / "model"
    model, tokenizer = load_model_and_tokenizer(model_dir)
    assert model.config.hidden_size == 32 and tokenizer.chat_template

    summary_path = tmp_path / "eval.json"
    code, out, err = cli("eval", "--env", env_id, "--policy", str(model_dir),
                         "--episodes", "2", "--max-turns", "2", "--json", str(summary_path), *one_env)
    assert code == 0, err[-3000:]
    summary = json.loads(summary_path.read_text())
    for key in ("env", "split", "episodes", "success", "pass_at_k", "avg_reward", "by_category"):
        assert key in summary
    assert (summary["env"], summary["split"], summary["episodes"], summary["errors"]) == (env_id, "test", 2, 0)
    assert 0.0 <= summary["success"] <= summary["pass_at_k"] <= 1.0


@pytest.mark.parametrize("recipe", ["babyai_strong", "textcraft_strong"])
def test_a_strong_recipe_runs_end_to_end_on_a_tiny_budget(tmp_path, capsys, monkeypatch, recipe):
    """The recipe's own code path (its warm-up with the observation loss, the curriculum, the
    20-turn validation) with everything cut small."""
    tiny = [override for override in TINY_RUN if not override.startswith(("env.kwargs", "warmup.episodes"))]
    code, out, err = cli("train", str(REPO / "configs" / f"{recipe}.yaml"), *tiny,
                         "warmup.episodes=4", "warmup.epochs=1", "model.corpus_episodes=4",
                         f"run.output_dir={tmp_path}", "run.name=run")
    assert code == 0, err[-3000:]
    assert "warm-up: " in out and "expert demonstrations" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/success" in r]
    assert [r["step"] for r in train_rows] == [1] and train_rows[0]["train/errors"] == 0


def test_a_run_starts_from_another_runs_warm_up(tmp_path, capsys, monkeypatch):
    """`warmup_model/` is the model as the warm-up left it: a run started from it without a
    warm-up plays the first run's step-0 validation episodes token for token."""
    tiny = [override for override in TINY_RUN if not override.startswith(("env.kwargs", "warmup.episodes"))]
    first = [*tiny, "warmup.episodes=4", "warmup.epochs=2", "model.corpus_episodes=4", "rollout.threads=1",
             "rollout.max_new_tokens=12", f"run.output_dir={tmp_path}"]
    code, _, err = cli("train", str(REPO / "configs" / "babyai_strong.yaml"), *first, "run.name=first")
    assert code == 0, err[-3000:]
    warmed, base = tmp_path / "first" / "warmup_model", tmp_path / "first" / "base_model"
    assert any(not torch.equal(load_file(warmed / "model.safetensors")[name], weights)
               for name, weights in load_file(base / "model.safetensors").items())
    code, out, err = cli("train", str(REPO / "configs" / "babyai_strong.yaml"), *first, "run.name=second",
                         f"model.path={warmed}", "warmup.episodes=0")
    assert code == 0, err[-3000:]
    assert "warm-up: " not in out

    def step_zero_validation(run: str) -> list[list[int]]:
        lines = (tmp_path / run / "validation" / "step_000000.jsonl").read_text().splitlines()
        return [json.loads(line)["input_ids"] for line in lines]

    assert step_zero_validation("first") == step_zero_validation("second")
