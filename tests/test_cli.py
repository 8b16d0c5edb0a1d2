"""The command-line contract, run as a user would (subprocess)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "agentgym_rl.cli"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_envs_and_algos_list_one_name_per_line():
    assert "babyai" in run("envs").stdout.split("\n")
    assert "grpo" in run("algos").stdout.split("\n")


@pytest.mark.parametrize("args, message", [
    (["eval", "--env", "nope", "--policy", "expert"], "unknown environment 'nope'"),
    (["eval", "--env", "babyai", "--policy", "/no/such/model"], "neither 'expert', 'random', 'api:MODEL' nor an existing model folder"),
    (["eval", "--env", "babyai", "--policy", "api:gpt-4o"], "--policy api:gpt-4o needs the API's address"),
    pytest.param(["eval", "--env", "babyai", "--policy", "tests", "rollout.generator=vllm"], "rollout.generator: vllm needs vLLM",
                 marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")),
    (["eval", "--env", "babyai", "--policy", "expert", "--split", "dev"], "unknown split 'dev'"),
    (["eval", "--env", "babyai", "--policy", "expert", "--episodes", "0"], "--episodes must be >= 1"),
    (["eval", "--policy", "expert", "--max-turns", "0"], "--max-turns (eval.max_turns): input should be greater"),
    (["eval", "--policy", "expert", "--samples", "0"], "--samples (eval.samples): input should be greater"),
    (["eval", "--policy", "expert", "eval.nope=1"], "unknown config key 'eval.nope'"),
    (["eval", "--episodes", "2"], "give --policy"),
    (["eval", "--run", "configs"], "'configs' is not a run folder"),
    (["collect", "--policy", "expert", "--out", "x.jsonl", "--temperature", "-1"],
     "--temperature (eval.temperature): input should be greater than or equal to 0"),
    (["eval", "--env", "babyai", "--policy", "expert", "--env-arg", "nope=1"], "bad arguments for environment 'babyai'"),
    (["eval", "--env", "search", "--policy", "expert", "--env-arg", "top_k=0"],
     "bad arguments for environment 'search': top_k must be >= 1"),
    (["eval", "--env", "search", "--policy", "random", "--episodes", "1"], "cannot list its actions"),
    (["eval", "--env", "web", "--policy", "expert", "--env-arg", "task_file=missing.json"],
     "the test tasks of 'web': no task file or folder 'missing.json'"),
    (["eval", "--env", "web", "--policy", "expert", "--env-arg", "timeout=0"], "bad arguments for environment 'web': timeout"),
    (["train", "missing.yaml"], "config file 'missing.yaml' does not exist"),
    (["train", "configs/babyai_grpo.yaml", "rollout.generator_url=http://127.0.0.1:1/v1"],
     "rollout.generator_url samples from a served model"),
    (["serve-model", "/no/such/model"], "model path '/no/such/model' is not a directory"),
    (["train", "configs/babyai_grpo.yaml", "algo.name=ppo2"], "unknown algorithm 'ppo2'"),
    (["train", "configs/babyai_grpo.yaml", "algo.bogus=1"], "unknown config key 'algo.bogus'"),
    (["train", "configs/babyai_grpo.yaml", "nonsense"], "not of the form key=value"),
    (["train", "configs/babyai_grpo.yaml", "model.path=/no/such/model"], "is not a directory with a config.json"),
])
def test_user_mistakes_are_one_line_errors(args, message):
    repo = Path(__file__).resolve().parent.parent
    result = run(*args, cwd=repo)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_eval_expert_writes_the_contracted_json(tmp_path):
    out = tmp_path / "expert.json"
    # 20 episodes run concurrently through the engine: the expert keeps one memory per env.
    result = run("eval", "--env", "babyai", "--policy", "expert", "--split", "test", "--episodes", "20",
                 "--json", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    for key in ("env", "split", "episodes", "success", "pass_at_k", "avg_reward", "by_category"):
        assert key in summary
    assert summary["env"] == "babyai" and summary["episodes"] == 20 and summary["success"] == 1.0
    assert "overall" in result.stdout


def test_eval_random_policy_is_poor(tmp_path):
    out = tmp_path / "random.json"
    result = run("eval", "--env", "babyai", "--policy", "random", "--episodes", "20", "--max-turns", "5",
                 "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["success"] < 0.6
