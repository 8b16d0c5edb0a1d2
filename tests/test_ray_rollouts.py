"""Rollout workers in Ray actors (`rollout.workers`): greedy rollouts through two workers equal
the in-process ones, sampled ones repeat with the same seed, weights sent after an update
change what the workers play, and a training run through the CLI uses them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_cli import run
from test_env_e2e import TINY_RUN

from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.backends import model_policy

ray = pytest.importorskip("ray")
from agentgym_rl.rollout.ray_workers import RayRollouts, RolloutWorkerError  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHAPE = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
ROLLOUT = RolloutConfig(max_new_tokens=6)
ENV = {"id": "babyai", "kwargs": {}, "urls": [], "timeout": 60.0, "invalid_action_penalty": 0.0}
TURNS = 3


def varied_model(tokenizer, seed: int):
    """Random weights large enough that greedy replies differ from task to task."""
    model = build_model(tokenizer, SHAPE, seed=seed).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed))
    return model


@pytest.fixture(scope="module")
def workers(tiny_tokenizer, ray_instance):
    pool = RayRollouts(2, "ray:local?cpus=0.5", varied_model(tiny_tokenizer, 0), tiny_tokenizer, ENV, ROLLOUT,
                       temperature=0.0)
    yield pool
    pool.close()


def in_process(model, tokenizer, tasks, temperature=0.0, sampling_seed=None):
    with RolloutEngine(registry.env_factory("babyai"), ROLLOUT) as engine:
        return engine.run(tasks, model_policy(model, tokenizer, temperature), TURNS, samples=2, seed=3,
                          sampling_seed=sampling_seed)


def replies(trajectories):
    """Each episode's sampled ids and outcome, keyed by (group, item) and in sample order."""
    out: dict = {}
    for t in trajectories:
        out.setdefault((t.group, t.item_id), []).append((t.input_ids, t.loss_mask, t.reward, t.turns))
    return out


def test_greedy_rollouts_through_workers_equal_the_in_process_ones(workers, tiny_tokenizer):
    tasks = registry.tasks("babyai", "test")[:5]
    remote = workers.run(tasks, TURNS, 2, seed=3, sampling_seed=0)
    local = in_process(varied_model(tiny_tokenizer, 0), tiny_tokenizer, tasks)
    assert replies(remote) == replies(local)
    assert len({tuple(t.input_ids) for t in remote}) > 1  # the replies do differ between tasks
    by_item = {t.item_id: t for t in remote}
    for t in local:  # logprobs as the in-process generator's, up to float rounding
        assert by_item[t.item_id].logprobs == pytest.approx(t.logprobs, abs=1e-4)


def test_synced_weights_reach_the_workers(workers, tiny_tokenizer):
    tasks = registry.tasks("babyai", "test")[:4]
    before = workers.run(tasks, TURNS, 1, seed=3, sampling_seed=0)
    updated = varied_model(tiny_tokenizer, 1)
    workers.sync_weights(updated)
    after = workers.run(tasks, TURNS, 1, seed=3, sampling_seed=0)
    assert [t.input_ids for t in after] != [t.input_ids for t in before]
    local = RolloutEngine(registry.env_factory("babyai"), ROLLOUT).run(
        tasks, model_policy(updated, tiny_tokenizer, 0.0), TURNS, samples=1, seed=3)
    assert replies(after) == replies(local)
    workers.sync_weights(varied_model(tiny_tokenizer, 0))  # as the other tests expect


def test_sampled_rollouts_repeat_with_the_same_seed_and_equal_the_in_process_ones(tiny_tokenizer, ray_instance):
    """Each episode samples from its own stream (seed, task, sample): one worker (a process,
    seconds to start) plays what this process plays, and so would any number of workers."""
    pool = RayRollouts(1, "ray:local?cpus=0.5", varied_model(tiny_tokenizer, 0), tiny_tokenizer, ENV, ROLLOUT,
                       temperature=1.0)
    try:
        tasks = registry.tasks("babyai", "test")[:4]
        first, again, other = (pool.run(tasks, TURNS, 2, seed=3, sampling_seed=s) for s in (5, 5, 6))
        assert [t.input_ids for t in first] == [t.input_ids for t in again]
        assert [t.input_ids for t in first] != [t.input_ids for t in other]
    finally:
        pool.close()
    local = in_process(varied_model(tiny_tokenizer, 0), tiny_tokenizer, tasks, temperature=1.0, sampling_seed=5)
    assert replies(first) == replies(local)


def test_a_worker_that_cannot_start_says_why(tiny_tokenizer, ray_instance):
    bad_env = {**ENV, "id": "no-such-env"}
    with pytest.raises(RolloutWorkerError, match="no-such-env"):
        RayRollouts(1, "ray:local?cpus=0.5", varied_model(tiny_tokenizer, 0), tiny_tokenizer, bad_env, ROLLOUT, 0.0)


def train(tmp_path, *overrides):
    """The train command in this process, so that it joins the session's Ray instance."""
    return run("train", str(REPO / "configs" / "babyai_grpo.yaml"), *TINY_RUN, "env.id=babyai",
               f"run.output_dir={tmp_path}", "run.name=run", *overrides)


@pytest.mark.slow
def test_a_training_run_plays_its_rollouts_in_workers(tmp_path, ray_instance):
    # PPO: its critic (0 at first) gives the tiny policy advantages even when every reward ties.
    # One worker (a process, seconds to start): how tasks are dealt to several is tested above.
    result = train(tmp_path, "rollout.workers=1", "rollout.workers_address=ray:local?cpus=0.5", "train.steps=2",
                   "algo.name=ppo", "env.invalid_action_penalty=0.1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "starting 1 Ray rollout worker (" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "train/success" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["update/trajectories"] == 4 and row["train/errors"] == 0 for row in steps)
    assert all(row["update/grad_norm"] > 0 for row in steps)
    played = [json.loads(line) for line in (tmp_path / "run" / "trajectories" / "step_000001.jsonl").open()]
    assert sorted(t["group"] for t in played) == [0, 0, 1, 1]  # each task's samples in one group


def test_a_bad_workers_address_is_a_user_error(tmp_path):
    result = train(tmp_path, "rollout.workers=2", "rollout.workers_address=ray:nowhere")
    assert result.returncode != 0
    assert "rollout.workers_address" in result.stderr and "Traceback" not in result.stderr
