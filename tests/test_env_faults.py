"""Environment faults cost one trajectory: an env that raises, hangs past the client's timeout
or answers garbage, or a server killed mid-rollout, ends only the episodes it was playing;
they are recorded as failed with the reason, left out of the update, and counted."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import CounterEnv, counter_tasks
from fastapi import FastAPI, Response
from test_server import serving, serving_app

from agentgym_rl.config import RLConfig, RolloutConfig, load_config
from agentgym_rl.envs import registry
from agentgym_rl.envs.remote import HttpEnv
from agentgym_rl.envs.tasks import Task
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import TextPolicy
from agentgym_rl.train.rl import RLTrainer

REPO = Path(__file__).resolve().parent.parent


class FaultyEnv(CounterEnv):
    """The counter game, with an injected fault on 20% of its items: index % 10 == 0 raises at
    its first step, index % 10 == 5 hangs for 3 s there (past a 2 s client timeout). Index
    % 10 == 7 marks that step's observation GARBLE, for a server to answer garbage (see
    `garbling`)."""

    env_id = "faulty"

    def reset(self, item_id=None, seed=None):
        self.index = int(str(item_id).split("_")[-1])
        return super().reset(item_id, seed)

    def step(self, action):
        if self.count == 0 and self.index % 10 == 0:
            raise RuntimeError("injected fault")
        if self.count == 0 and self.index % 10 == 5:
            time.sleep(3)
        if self.count == 0 and self.index % 10 == 7:
            observation, *rest = super().step(action)
            return ("GARBLE " + observation, *rest)
        return super().step(action)


def garbling(app: FastAPI) -> None:
    """Make `app` answer an HTML page, with status 200, in place of any answer holding GARBLE
    (as a proxy in a bad state might)."""

    @app.middleware("http")
    async def garble(request, call_next):
        response = await call_next(request)
        body = b"".join([chunk async for chunk in response.body_iterator])
        if b"GARBLE" in body:
            return Response(b"<html><body>502 Bad Gateway</body></html>", media_type="text/html")
        return Response(body, status_code=response.status_code, headers=dict(response.headers))


def faulty_tasks(split):
    return [Task("faulty", t.index, t.category) for t in counter_tasks(split)]


@pytest.fixture(scope="module")
def faulty_registered():
    if "faulty" not in registry.env_ids():
        registry.register(registry.EnvSpec("faulty", "test_env_faults:FaultyEnv", "test_env_faults:faulty_tasks",
                                           max_turns=3, expert_entry_point="conftest:CounterExpert"))
    return "faulty"


class Counting(TextPolicy):
    def reply(self, env):
        return "Action: count"


@pytest.mark.slow
def test_a_training_step_with_20_percent_failing_episodes_completes_and_counts_them(tmp_path, faulty_registered,
                                                                                    counter_env_registered):
    """10 tasks, among them raising ones: their episodes fail, are left out of the update, and
    the step logs them; the others (hanging ones too: in process nothing times out) train."""
    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [
        "env.id=faulty", "env.kwargs={}", f"run.output_dir={tmp_path}", "run.name=faults", "warmup.episodes=0",
        "model.corpus_episodes=6", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320",
        "algo.tasks_per_step=10", "algo.group_size=2", "rollout.max_new_tokens=4", "schedule.horizons=[2]",
        "train.steps=1", "train.validate_every=0", "optim.micro_batch_size=4"])
    trainer = RLTrainer(config, log=lambda _: None)
    faulty = [t for t in trainer.sample_tasks(0) if t.index % 10 == 0]
    trainer.fit()
    [row] = [json.loads(line) for line in (tmp_path / "faults" / "metrics.jsonl").read_text().splitlines()]
    assert row["train/errors"] == row["update/failed_episodes_left_out"] == 2 * len(faulty) > 0
    episodes = [json.loads(line) for line in (tmp_path / "faults" / "trajectories" / "step_000001.jsonl")
                .read_text().splitlines()]
    failed = [e for e in episodes if e["error"]]
    assert len(failed) == 2 * len(faulty) and all("injected fault" in e["error"] for e in failed)
    assert all(e["error"] is None for e in episodes if int(e["item_id"].split("_")[-1]) % 10 != 0)


def test_a_hanging_or_raising_env_behind_a_server_fails_only_its_episodes(faulty_registered):
    tasks = faulty_tasks("train")[:6]  # items 0 (raises) and 5 (hangs), 1..4 fine
    with serving("faulty") as url:
        engine = RolloutEngine(lambda: HttpEnv(url, timeout=2.0), RolloutConfig())
        trajectories = engine.run(tasks, Counting(), max_turns=3)
    by_item = {t.item_id: t for t in trajectories}
    assert "injected fault" in by_item["faulty_0"].error  # the server's 500, as the client saw it
    assert "Timeout" in by_item["faulty_5"].error
    assert all(by_item[f"faulty_{i}"].error is None and by_item[f"faulty_{i}"].success for i in range(1, 5))


def test_a_malformed_answer_fails_the_episode_with_the_reason():
    app = FastAPI()
    app.get("/v1/info")(lambda: {"env_id": "counter", "instruction": "", "max_turns": 3})
    app.post("/v1/envs")(lambda: {"id": 1})
    app.post("/v1/envs/1/reset")(lambda: {"observation": "Goal: count to 1.", "info": {"item_id": "counter_0"}})
    app.post("/v1/envs/1/step")(lambda: {"observation": 42, "reward": "lots"})
    app.delete("/v1/envs/1")(lambda: {"closed": 1})
    with serving_app(app) as url:
        [trajectory] = RolloutEngine(lambda: HttpEnv(url)).run([Task("counter", 0, "goal1")], Counting(), max_turns=3)
    assert "malformed step answer" in trajectory.error


def test_killing_a_server_mid_rollout_fails_only_its_episodes(counter_env_registered):
    """Two servers; after the first turn one of them is shut down: the episodes it held end as
    failed with the reason, the other server's episodes finish intact."""
    with serving("counter") as first:
        stopper: dict = {}

        class KillsAfterFirstTurn(TextPolicy):
            turns = 0

            def act(self, envs, prompts, max_new_tokens, conversations=None, streams=None):
                self.turns += 1
                if self.turns == 2:
                    stopper["stop"]()
                return super().act(envs, prompts, max_new_tokens)

            def reply(self, env):
                return "Action: count"

        import contextlib

        stack = contextlib.ExitStack()
        second = stack.enter_context(serving("counter"))
        stopper["stop"] = stack.close
        urls = iter([first, second] * 8)
        engine = RolloutEngine(lambda: HttpEnv(next(urls), retries=1, backoff=0.01), RolloutConfig())
        tasks = [Task("counter", i, "goal3") for i in (2, 5, 8, 11)]  # goal 3: three turns each
        trajectories = engine.run(tasks, KillsAfterFirstTurn(), max_turns=3)
        stack.close()
    on_first, on_second = trajectories[0::2], trajectories[1::2]
    assert all(t.error is None and t.success for t in on_first)
    assert all(t.error is not None and "cannot connect" in t.error for t in on_second)
    assert all(t.turns == 1 for t in on_second)  # what they played before the server went is kept


def test_a_training_step_through_servers_survives_raising_hanging_and_garbled_envs(tmp_path, faulty_registered):
    """30% of faulty tasks behind a server: raising, hanging past env.server_timeout, and
    answered with garbage: the step completes and counts every failed episode."""
    with serving("faulty", wrap=garbling) as url:
        config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [
            "env.id=faulty", "env.kwargs={}", f"env.urls=[{url}]", "env.server_timeout=2", f"run.output_dir={tmp_path}",
            "run.name=served", "warmup.episodes=0", "model.corpus_episodes=6", "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
            "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320", "algo.tasks_per_step=10",
            "algo.group_size=2", "rollout.max_new_tokens=4", "schedule.horizons=[2]", "train.steps=1",
            "train.validate_every=0", "optim.micro_batch_size=4"])
        trainer = RLTrainer(config, log=lambda _: None)
        faulty = [t for t in trainer.sample_tasks(0) if t.index % 10 in (0, 5, 7)]
        trainer.fit()
    [row] = [json.loads(line) for line in (tmp_path / "served" / "metrics.jsonl").read_text().splitlines()]
    assert row["train/errors"] == row["update/failed_episodes_left_out"] == 2 * len(faulty) > 0
    episodes = [json.loads(line) for line in (tmp_path / "served" / "trajectories" / "step_000001.jsonl")
                .read_text().splitlines()]
    errors = [e["error"] for e in episodes if e["error"]]
    # The step's tasks hold every kind of fault (item 10; 5 and 15; 17), each failed as it should.
    assert sorted(t.index for t in faulty) == [5, 10, 15, 17]
    assert sum("injected fault" in e for e in errors) == 2 and sum("Timeout" in e for e in errors) == 4
    assert sum("not a JSON answer" in e for e in errors) == 2
