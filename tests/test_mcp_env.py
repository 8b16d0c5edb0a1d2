"""The tools of an MCP server as an environment (`env.id: mcp`, `envs/mcp/`), against the
project's own calculator server: tool calls parsed from replies, failures as observations, the
expert's tasks solved over stdio and streamable HTTP, a task file, `eval`, and one RL step of
the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from test_cli import run
from test_server import free_port
from test_train_e2e import toy_config

from agentgym_rl.envs import make, registry
from agentgym_rl.envs.checker import check_env
from agentgym_rl.envs.mcp.env import FINAL_ANSWER, answers_match, mcp_tasks, parse_tool_call, tool_call_text


def test_a_reply_is_read_as_its_last_tool_call_by_hand():
    assert parse_tool_call('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>') == ("add", {"a": 1})
    assert parse_tool_call('first <tool_call>{"name": "a", "arguments": {}}</tool_call> then '
                           '<tool_call>{"name": "b", "arguments": {"x": [1, {"y": 2}]}}</tool_call>') == \
        ("b", {"x": [1, {"y": 2}]})
    assert parse_tool_call('Thought: 3. {"name": "multiply", "arguments": {"a": 2, "b": 3}} done') == \
        ("multiply", {"a": 2, "b": 3})  # a bare object, nested braces and all
    assert parse_tool_call('<tool_call>{"name": "add", "arguments": "{\\"a\\": 5}"}</tool_call>') == ("add", {"a": 5})
    assert parse_tool_call('<tool_call>{"name": "add", "arguments": [1]}</tool_call>') == \
        "the arguments are not a JSON object"
    assert parse_tool_call("Action: add 1 2").startswith("no tool call")
    assert parse_tool_call(tool_call_text(FINAL_ANSWER, {"answer": "7"})) == (FINAL_ANSWER, {"answer": "7"})
    assert answers_match("35.0", "35") and answers_match(" Paris ", "paris") and not answers_match("34", "35")


@pytest.fixture(scope="module")
def env():
    env = make("mcp", max_turns=8)
    yield env
    env.close()


def test_the_calculators_tasks_are_solved_by_the_expert_and_failures_are_observations(env):
    assert {tool for tool in env.unwrapped.tools} == {"add", "subtract", "multiply", "divide"}
    assert "JSON Schema" in env.instruction and FINAL_ANSWER in env.instruction
    for item in ("mcp_0", "mcp_1"):
        observation, info = env.reset(item)
        assert observation.startswith("Task: Compute (") and info["item_id"] == item
        steps = 0
        while True:
            observation, reward, terminated, truncated, info = env.step(env.expert_action())
            steps += 1
            if terminated or truncated:
                break
        assert (steps, reward, info["success"], observation) == (3, 1.0, True, "Correct.")
    env.reset("mcp_0")
    said = [env.step(reply) for reply in (
        "no call here", '<tool_call>{"name": "sqrt", "arguments": {"a": 4}}</tool_call>',
        '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>')]
    assert all(info["invalid_action"] and not terminated for _, _, terminated, _, info in said)
    assert "unknown tool 'sqrt'" in said[1][0] and "division by zero" in said[2][0]
    assert env.step(tool_call_text(FINAL_ANSWER, {"answer": "-1"}))[1:3] == (0.0, True)


def test_it_passes_the_environment_checks():
    fresh = make("mcp")
    try:
        check_env(fresh)
    finally:
        fresh.close()


def test_a_task_file_brings_its_own_tasks_and_a_bad_one_is_one_line(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    solution = [{"name": "multiply", "arguments": {"a": 6, "b": 7}}]
    tasks.write_text("\n".join(json.dumps(task) for task in (
        {"instruction": "What is 6 times 7?", "answer": 42, "category": "times", "split": "train", "solution": solution},
        {"instruction": "What is 2 plus 2?", "answer": "4", "category": "plus"})) + "\n")
    assert [t.item_id for t in mcp_tasks("train", str(tasks))] == ["mcp_0"]
    assert [(t.item_id, t.category) for t in mcp_tasks("test", str(tasks))] == [("mcp_1", "plus")]
    env = make("mcp", task_file=str(tasks))
    try:
        assert env.reset("mcp_0")[0] == "Task: What is 6 times 7?"
        env.step(env.expert_action())
        assert env.step(env.expert_action())[1:3] == (1.0, True)
        env.reset("mcp_1")
        assert env.expert_action() is None  # no solution given
    finally:
        env.close()
    (tmp_path / "bad.jsonl").write_text('{"instruction": "no answer"}\n')
    result = run("eval", "--env", "mcp", "--policy", "expert", f"--env-arg=task_file={tmp_path / 'bad.jsonl'}")
    assert result.returncode == 2 and "bad.jsonl:1" in result.stderr and "Traceback" not in result.stderr


def test_a_server_over_streamable_http(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "agentgym_rl.envs.mcp.calculator", "--http", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and server.poll() is None, "the MCP server did not start"
                time.sleep(0.2)
        env = make("mcp", server=f"http://127.0.0.1:{port}/mcp")
        try:
            env.reset("mcp_2")
            assert env.step(env.expert_action())[0].startswith("add returned: ")
        finally:
            env.close()
    finally:
        server.terminate()
        server.wait(10)


def test_a_server_that_does_not_start_is_one_line():
    result = run("eval", "--env", "mcp", "--policy", "expert", "--env-arg", "server=no-such-mcp-server-command")
    assert result.returncode == 2 and "cannot start an MCP session" in result.stderr


def test_eval_and_one_rl_step_of_the_tiny_model(tmp_path):
    """The expert's calls solve every item through `eval`; then one GRPO step of the tiny model,
    warmed up on the expert: its calls are mostly rejected after so short a warm-up, so a shaped
    reward (`env.reward`: the reply's length) gives the step a signal, and it updates."""
    out = tmp_path / "eval.json"
    assert run("eval", "--env", "mcp", "--policy", "expert", "--episodes", "4", "--json", str(out)).returncode == 0
    assert json.loads(out.read_text())["success"] == 1.0
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "train.steps=1", "train.validate_every=1", "schedule.horizons=[3]",
                        "rollout.max_new_tokens=40", "eval.max_turns=3", "env.reward=reward_fns:reply_chars",
                        "algo.kl_coef=0", env="mcp", name="mcp")
    RLTrainer(config, log=lambda _: None).fit()
    rows = [json.loads(line) for line in (tmp_path / "mcp" / "metrics.jsonl").read_text().splitlines()]
    step = next(row for row in rows if "train/success" in row)
    assert step["update/trajectories"] > 0 and step["train/errors"] == 0 and step["train/turns"] > 0
    assert [row["step"] for row in rows if "val/success" in row] == [0, 1]
    assert registry.spec("mcp").safe_kwargs == {}  # no request may name a server command


def test_a_task_files_expert_follows_steps_without_arguments_and_a_random_reset_draws_its_test_items(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"instruction": "Add nothing.", "answer": "0", "split": "test",
                                 "solution": [{"name": "add"}]}) + "\n")
    env = make("mcp", task_file=str(tasks))
    try:
        assert env.reset(seed=3)[1]["item_id"] == "mcp_0"  # the file's only test item
        assert json.loads(env.expert_action()[len("<tool_call>"):-len("</tool_call>")]) == {"name": "add", "arguments": {}}
        env.step(env.expert_action())  # rejected (a and b are required): the expert stays on this step
        assert "add" in env.expert_action()
    finally:
        env.close()


def test_eval_run_takes_no_program_code_or_url_from_a_runs_config(tmp_path):
    """A run folder may come from someone else: `eval --run` takes from its config.yaml no reward
    code, judge URL, env servers, nor a constructor argument a request could not set (an MCP
    server's command line, a task file); the safe ones stay."""
    from agentgym_rl.runs import played_settings

    (tmp_path / "config.yaml").write_text(
        "env: {id: babyai, reward: reward_fns:broken, judge: {url: 'http://attacker.example/v1'},\n"
        "      urls: ['http://attacker.example'], kwargs: {list_actions: false}}\n")
    said = []
    env = played_settings(tmp_path, log=said.append)["env"]
    assert env == {"id": "babyai", "kwargs": {"list_actions": False}}
    assert "env.reward, env.judge, env.urls of the run are not taken from its config.yaml" in said[0]
    (tmp_path / "config.yaml").write_text(
        "env: {id: mcp, kwargs: {server: 'touch /tmp/planted-by-a-config', task_file: /tmp/x.jsonl}}\n")
    said.clear()
    assert played_settings(tmp_path, log=said.append)["env"] == {"id": "mcp", "kwargs": {}}
    assert "env.kwargs.server, env.kwargs.task_file of the run" in said[0]


def test_a_random_reset_needs_a_test_task(tmp_path):
    tasks = tmp_path / "train_only.jsonl"
    tasks.write_text(json.dumps({"instruction": "x", "answer": "1", "split": "train"}) + "\n")
    env = make("mcp", task_file=str(tasks))
    try:
        with pytest.raises(ValueError, match="has no test task to draw from"):
            env.reset(seed=0)
    finally:
        env.close()
