"""Wrappers: the invalid-action penalty changes the training reward only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CounterEnv

from agentgym_rl.envs import registry
from agentgym_rl.envs.wrappers import InvalidActionPenalty
from agentgym_rl.errors import UserError

REPO = Path(__file__).resolve().parent.parent


def test_penalty_is_subtracted_on_invalid_steps_only():
    env = InvalidActionPenalty(CounterEnv(), 0.25)
    env.reset("counter_1")  # goal: count to 2
    _, reward, terminated, _, info = env.step("look")  # invalid: 0 - 0.25
    assert (reward, terminated, info["invalid_action"]) == (-0.25, False, True)
    _, reward, *_ = env.step("count")  # valid, not yet the goal: 0.1
    assert reward == pytest.approx(0.1)
    _, reward, terminated, _, info = env.step("count")  # goal reached: 1 + 0.1
    assert (reward, terminated, info["success"]) == (pytest.approx(1.1), True, True)


def test_factory_wraps_only_with_a_penalty(counter_env_registered):
    make_env = registry.env_factory("counter", {})
    assert isinstance(registry.with_invalid_action_penalty(make_env, 0.5)(), InvalidActionPenalty)
    assert registry.with_invalid_action_penalty(make_env, 0.0) is make_env
    assert isinstance(make_env(), CounterEnv)
    with pytest.raises(UserError, match="invalid_action_penalty"):
        registry.with_invalid_action_penalty(make_env, -1)


def test_trainer_penalises_training_rollouts_not_validation(tmp_path, counter_env_registered):
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.rollout.trajectory import load_trajectories
    from agentgym_rl.train.rl import RLTrainer

    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [
        "env.id=counter", "env.kwargs={}", "env.invalid_action_penalty=0.5", f"run.output_dir={tmp_path}",
        "run.name=toy", "model.corpus_episodes=6", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
        "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=320", "warmup.episodes=0", "algo.tasks_per_step=2", "algo.group_size=3",
        "rollout.max_new_tokens=6", "schedule.horizons=[3]", "train.steps=1", "train.validate_every=1",
        "eval.episodes=3", "optim.micro_batch_size=2"])
    RLTrainer(config, log=lambda _: None).fit()
    sampled = load_trajectories(tmp_path / "toy" / "trajectories" / "step_000001.jsonl")
    invalid = [r for t in sampled for r, msg in zip(t.turn_rewards, t.messages[2::2]) if "Nothing happens" in msg["content"]]
    assert invalid and all(r == -0.5 for r in invalid)  # an untrained model mostly says something else
    validations = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()
                   if "val/reward" in json.loads(line)]
    assert len(validations) == 2 and all(v["val/reward"] >= 0 for v in validations)
