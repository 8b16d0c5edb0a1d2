"""The AppWorld adapter against a stand-in for AppWorld's environment server (`appworld_fake`):
tasks from the data folder, the episode's calls, AppWorld's tests as the verdict, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from appworld_fake import TEST_IDS, create_fake_appworld, write_data_root
from conftest import CORPUS
from test_cli import run
from test_model_server import TINY
from test_server import free_port, serving_app

from agentgym_rl.agent.tiny import build_tiny
from agentgym_rl.envs import check_env, registry
from agentgym_rl.envs.appworld.env import code_of
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import TextPolicy

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return str(write_data_root(tmp_path_factory.mktemp("appworld")))


@pytest.fixture(scope="module")
def server():
    app = create_fake_appworld()
    with serving_app(app) as url:
        yield url, app.state.fake


@pytest.fixture
def env(server, data_root):
    made = registry.make("appworld", url=server[0], data_root=data_root)
    yield made
    made.close()


def block(code: str) -> str:
    return f"Thought: let me compute.\n```python\n{code}\n```"


def test_tasks_come_from_the_data_folder_with_their_difficulty(data_root):
    test = registry.tasks("appworld", "test", {"data_root": data_root})
    train = registry.tasks("appworld", "train", {"data_root": data_root})
    assert [(t.index, t.category) for t in test] == [(0, "difficulty 1"), (1, "difficulty 3")]
    assert [(t.index, t.category) for t in train] == [(2, "difficulty 2")]
    with pytest.raises(UserError, match="no task list .*test_challenge.txt"):
        registry.tasks("appworld", "test", {"data_root": data_root, "test_set": "test_challenge"})


def test_an_episode_solved_by_code(env, server):
    observation, info = env.reset(0)
    assert observation.startswith("Task: What is 2 plus 3?") and "Ann Lee" in observation
    assert info == {"item_id": "appworld_0", "task_id": TEST_IDS[0]}
    observation, reward, terminated, _, info = env.step(block("print(apis.calculator.add(2, 3))"))
    assert (observation.strip(), reward, terminated, info["invalid_action"]) == ("5", 0.0, False, False)
    observation, reward, terminated, truncated, info = env.step(block("apis.supervisor.complete_task(answer=5)"))
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert (info["tests_passed"], info["num_tests"]) == (2, 2)


def test_a_wrong_answer_fails_the_tests(env):
    env.reset(0)
    _, reward, terminated, _, info = env.step(block("apis.supervisor.complete_task(answer=6)"))
    assert (reward, terminated, info["success"], info["tests_passed"]) == (0.0, True, False, 1)


def test_replies_without_code_and_failing_code_are_invalid(env, server):
    env.reset(1)
    calls = len(server[1]["calls"])
    observation, _, terminated, _, info = env.step("I will text Joyce.")
    assert info["invalid_action"] and not terminated and "```python" in observation
    assert len(server[1]["calls"]) == calls  # nothing was sent to the server
    observation, _, _, _, info = env.step(block("apis.phone.no_such_api()"))
    assert info["invalid_action"] and observation.startswith("Execution failed")
    assert code_of("```\nx = 1\n```\nthen\n```py\nprint(x)\n```") == "print(x)" and code_of("```python\n```") is None


def test_the_text_env_contract(server, data_root):
    check_env(registry.make("appworld", url=server[0], data_root=data_root), item_id=0,
              actions=[block("print(apis.api_docs.show_app_descriptions())")])


class Solver(TextPolicy):
    """Completes every task at once with the answer of the first one."""

    def reply(self, env):
        return block("apis.supervisor.complete_task(answer=apis.calculator.add(2, 3))")


def test_episodes_through_the_rollout_engine(server, data_root):
    """The rollout engine plays AppWorld one task at a time (one per server) and records
    AppWorld's verdict: the first test task is solved, the second (a text message) is not."""
    make_env = registry.env_factory("appworld", {"url": server[0], "data_root": data_root})
    tasks = registry.tasks("appworld", "test", {"data_root": data_root})
    with RolloutEngine(make_env) as engine:
        played = engine.run(tasks, Solver(), max_turns=3)
    assert [(t.item_id, t.success, t.turns) for t in played] == [("appworld_0", True, 1), ("appworld_1", False, 1)]


def test_user_mistakes_are_one_line_errors(data_root, monkeypatch):
    monkeypatch.delenv("APPWORLD_ROOT", raising=False)
    port = free_port()
    for args, message in [
        ([], "environment 'appworld' needs the user's AppWorld data: set env.kwargs.data_root"),
        (["--env-arg", f"data_root={data_root}", "--env-arg", f"url=http://127.0.0.1:{port}"],
         f"no AppWorld environment server answers at http://127.0.0.1:{port}"),
    ]:
        result = run("eval", "--env", "appworld", "--policy", "api:m", "rollout.generator_url=http://127.0.0.1:1/v1",
                     *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_bench_agent_leaves_it_out_unless_asked():
    assert registry.spec("appworld").requires and "appworld" in registry.env_ids()
    assert all(registry.spec(e).requires is None for e in ("babyai", "textcraft", "sciworld", "search", "web"))


def test_the_loop_recipe_trains_through_the_server(server, data_root, tmp_path):
    """configs/gpu/qwen7b_appworld_loop.yaml on a tiny budget: a tiny model on the CPU instead of
    Qwen, the stand-in server instead of AppWorld's."""
    model = build_tiny(CORPUS, tmp_path / "model", TINY)
    result = run("train", "configs/gpu/qwen7b_appworld_loop.yaml", f"model.path={model}", "run.device=cpu",
                 "run.dtype=float32", f"env.kwargs.url={server[0]}", f"env.kwargs.data_root={data_root}",
                 "rollout.max_new_tokens=8", "rollout.max_context=2048", "algo.tasks_per_step=1", "algo.group_size=2",
                 "algo.minibatch_size=2", "schedule.horizons=[2]", "train.steps=1", "train.validate_every=1",
                 "train.save_every=1", "eval.episodes=2", "eval.max_turns=2", f"run.output_dir={tmp_path}",
                 "run.name=loop", cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "loop" / "metrics.jsonl").read_text().splitlines()]
    trained = next(r for r in rows if "train/success" in r)
    assert trained["train/errors"] == 0 and trained["train/turns"] > 0
    assert sum("val/success" in r for r in rows) == 2
