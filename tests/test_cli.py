"""The command-line contract: exit codes and output of the `agentgym-rl` entry point."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from agentgym_rl.cli import main

CLI = [sys.executable, "-m", "agentgym_rl.cli"]


def run_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command in a process of its own, as a user runs it."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command through the same entry point, in this process: its exit code and output as
    `run_process` gives them, without paying ~5 s of torch and transformers imports per call."""
    stdout, stderr = io.StringIO(), io.StringIO()
    previous_dir, previous_columns = os.getcwd(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(list(args))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            except Exception:  # a bug, not a user mistake: the traceback a process would print
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(previous_dir)
        if previous_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous_columns
    return subprocess.CompletedProcess([*CLI, *args], code, stdout.getvalue(), stderr.getvalue())


def cli(*args: str) -> tuple[int, str, str]:
    """`run`'s exit code, stdout and stderr."""
    result = run(*args)
    return result.returncode, result.stdout, result.stderr


def test_envs_and_algos_list_one_name_per_line():
    assert "babyai" in run("envs").stdout.split("\n")
    assert "grpo" in run("algos").stdout.split("\n")
    # With --settings, each algorithm's values of the algo.* keys a config leaves null, as YAML.
    lines = run("algos", "--settings").stdout.splitlines()
    loop = lines[lines.index(next(line for line in lines if line.startswith("loop: "))):]
    assert "  algo.clip_eps: 0.1" in loop and "  algo.normalize_std: false" in loop and "  algo.tis_cap: null" in loop


def test_a_user_mistake_ends_the_process_with_one_line_and_exit_code_2():
    result = run_process("train", "missing.yaml")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: config file 'missing.yaml' does not exist"]


def test_a_captured_log_gets_each_line_as_it_is_written():
    # A run whose output goes to a file or a pipe is killed right after its first line: the line
    # is there (Python would otherwise hold it in an 8 KB buffer, and a kill loses the buffer).
    killed_after_one_line = ("import os\nfrom agentgym_rl import cli\n"
                             "cli.app = lambda args: (print('step 1 of 30'), os._exit(9))\ncli.main([])")
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    result = subprocess.run([sys.executable, "-c", killed_after_one_line], capture_output=True, text=True, timeout=60,
                            env=buffered)
    assert (result.returncode, result.stdout) == (9, "step 1 of 30\n")


@pytest.mark.parametrize("args, message", [
    (["eval", "--env", "nope", "--policy", "expert"], "unknown environment 'nope'"),
    (["eval", "--env", "babyai", "--policy", "/no/such/model"], "neither 'expert', 'random', 'api:MODEL', a named model (smollm2-135m-instruct) nor an existing model folder"),
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
     "(rollout.generator_url) samples with weights the learner cannot update"),
    (["serve-model", "/no/such/model"], "model path '/no/such/model' is not a directory"),
    (["train", "configs/babyai_grpo.yaml", "algo.name=ppo2"], "unknown algorithm 'ppo2'"),
    (["train", "configs/babyai_grpo.yaml", "algo.bogus=1"], "unknown config key 'algo.bogus'"),
    (["train", "configs/babyai_grpo.yaml", "nonsense"], "not of the form key=value"),
    (["train", "configs/babyai_grpo.yaml", "model.path=/no/such/model"], "is not a directory with a config.json"),
    (["train", "configs/babyai_grpo.yaml", "run.name=../elsewhere"], "run.name must name a folder inside run.output_dir"),
    (["train", "configs"], "config file 'configs' is a folder; give a YAML file"),
    (["train", "configs/babyai_sft.yaml"], "configs/babyai_sft.yaml is a config for `agentgym-rl sft`"),
    (["serve-model", "no-such-model"], "(a named model is one of: smollm2-135m-instruct;"),
    # output files are checked before the work, not after it
    (["eval", "--policy", "expert", "--episodes", "1", "--json", "configs"], "--json 'configs' is a folder"),
    (["collect", "--policy", "expert", "--episodes", "1", "--out", "configs"], "--out 'configs' is a folder"),
    (["eval", "--policy", "expert", "--env-arg", "list_actions"], "--env-arg 'list_actions' is not of the form key=value"),
    (["eval", "--policy", "expert", "--env-arg", "=true"], "--env-arg '=true' is not of the form key=value"),
    (["compare", "configs/babyai_grpo.yaml", "--seeds", ""], "--seeds must be comma-separated integers"),
    (["compare", "configs/babyai_grpo.yaml", "--seeds", "0,,1"], "--seeds must be comma-separated integers"),
    (["compare", "configs/babyai_grpo.yaml", "--seeds", "1,1"], "--seeds gives a seed twice"),
    (["compare", "configs/babyai_grpo.yaml", "configs/babyai_dpo.yaml"], "is a config for `agentgym-rl dpo`"),
    (["bench-agent", "no-such-policy", "--envs", "babyai"], "policy 'no-such-policy' is neither 'expert'"),
    (["bench-agent", "configs", "--envs", "babyai"], "model path 'configs' has no config.json"),
    (["bench-agent", "expert", "--envs", ","], "--envs names no environment"),
    (["bench-agent", "expert", "--envs", "babyai", "--out", "README.md"], "--out 'README.md' is a file"),
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
    assert summary["temperature"] == 0.0  # greedy unless told, as the published figures are
    assert "overall" in result.stdout


def test_eval_is_greedy_unless_told():
    from agentgym_rl.cli import _play_config

    flags = {"--env": "babyai", "--temperature": None}
    assert _play_config("expert", None, flags, None, None)[0].eval.temperature == 0.0  # what eval builds
    assert _play_config("expert", None, {**flags, "--temperature": 0.7}, None, None)[0].eval.temperature == 0.7


def test_eval_random_policy_is_poor(tmp_path):
    out = tmp_path / "random.json"
    result = run("eval", "--env", "babyai", "--policy", "random", "--episodes", "20", "--max-turns", "5",
                 "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["success"] < 0.6
