"""Rewards written in Python (`env.reward`, `rollout/rewards.py`): loaded from an import path,
put on an episode's last turn (replace or add, by hand), applied by the engine in training,
validation and `eval`, and failing only their own episode."""

from __future__ import annotations

import json

import pytest
from test_cli import run
from test_train_e2e import toy_config

from agentgym_rl.errors import UserError
from agentgym_rl.rollout.rewards import EpisodeReward, load_reward
from agentgym_rl.rollout.trajectory import Trajectory


@pytest.mark.parametrize("path, said", [
    ("reward_fns", "give the function as package.module:function"),
    ("no_such_module_here:f", "cannot import 'no_such_module_here'"),
    ("reward_fns:missing", "reward_fns has no function 'missing'"),
    ("reward_fns:NOT_CALLABLE", "reward_fns has no function 'NOT_CALLABLE'"),
])
def test_a_reward_path_that_names_no_function_is_one_line(path, said):
    with pytest.raises(UserError, match=said):
        load_reward(path)


def test_the_value_goes_on_the_last_turn_replacing_or_adding_by_hand():
    def episode():
        return Trajectory("e", "e_0", "c", turn_rewards=[0.1, -0.1, 1.0], success=True)

    replaced, added, empty = episode(), episode(), Trajectory("e", "e_1", "c")
    EpisodeReward(lambda t, info: 0.25, "replace").apply(replaced, {})
    EpisodeReward(lambda t, info: 0.25, "add").apply(added, {})
    EpisodeReward(lambda t, info: 0.25).apply(empty, {})
    assert replaced.turn_rewards == [0.0, 0.0, 0.25] and replaced.reward == 0.25 and replaced.success
    assert added.turn_rewards == [0.1, -0.1, 1.25] and added.reward == pytest.approx(1.25)
    assert empty.turn_rewards == []  # no turn to carry it
    for value in (float("nan"), True, "1", None):
        with pytest.raises(ValueError, match="not a finite number"):
            EpisodeReward(lambda t, info, value=value: value).apply(episode(), {})
    with pytest.raises(ValueError, match="reward_mode"):
        EpisodeReward(lambda t, info: 0.0, "multiply")


def test_eval_plays_the_functions_reward_and_a_failing_one_fails_its_episodes_only(tmp_path):
    out = tmp_path / "eval.json"
    common = ["--env", "babyai", "--policy", "expert", "--episodes", "4", "--max-turns", "20", "--json", str(out)]
    assert run("eval", *common).returncode == 0
    plain = json.loads(out.read_text())
    assert run("eval", *common, "env.reward=reward_fns:by_turns").returncode == 0
    ruled = json.loads(out.read_text())
    assert ruled["success"] == plain["success"] == 1.0  # success stays the environment's
    episodes = tmp_path / "episodes.jsonl"
    assert run("eval", *common, "env.reward=reward_fns:by_turns", "--trajectories", str(episodes)).returncode == 0
    turns = [len(json.loads(line)["turn_rewards"]) for line in episodes.read_text().splitlines()]
    assert ruled["avg_reward"] == pytest.approx(sum(2.0 / n for n in turns) / len(turns))  # by hand
    assert run("eval", *common, "env.reward=reward_fns:half", "env.reward_mode=add").returncode == 0
    assert json.loads(out.read_text())["avg_reward"] == pytest.approx(plain["avg_reward"] + 0.5)
    result = run("eval", *common, "env.reward=reward_fns:broken")
    assert result.returncode == 0 and json.loads(out.read_text())["errors"] == 4
    bad = run("eval", *common, "env.reward=reward_fns:missing")
    assert bad.returncode == 2 and "reward_fns has no function 'missing'" in bad.stderr


def test_a_failing_reward_keeps_its_environment_and_is_not_played_again():
    """A reward function that raises fails its episode, but the environment is sound: it is
    reused, and `rollout.episode_retries` does not play the episode again."""
    from agentgym_rl.config import RolloutConfig
    from agentgym_rl.envs import registry
    from agentgym_rl.eval.evaluate import make_policy
    from agentgym_rl.rollout.engine import RolloutEngine
    from reward_fns import broken

    tasks = registry.tasks("babyai", "test")[:4]
    engine = RolloutEngine(registry.env_factory("babyai"), RolloutConfig(episode_retries=2, threads=1, max_envs=1),
                           EpisodeReward(broken, name="reward_fns:broken"))
    with engine:
        played = engine.run(tasks, make_policy("babyai", "expert", 0.0, 0), 20)
    assert [t.error for t in played] == ["reward_fns:broken: RuntimeError: the judge is down"] * 4
    assert engine.retried == 0 and engine.envs_made == 1


def test_a_constant_added_to_every_reward_leaves_grpos_update_as_it_was(tmp_path, counter_env_registered):
    """GRPO compares a task's samples: a reward function plus 0.5 moves the step's mean reward by
    0.5 and leaves every advantage, the loss and the gradient as they were; "add" mode adds to the
    environment's reward. The episodes carry the function's values (checked by hand from them)."""
    from agentgym_rl.train.rl import RLTrainer

    def step(name, *extra):
        config = toy_config(tmp_path, "train.steps=1", "train.validate_every=1", "algo.kl_coef=0",
                            "train.save_trajectories=true", *extra, name=name)
        RLTrainer(config, log=lambda _: None).fit()
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        episodes = [json.loads(line) for line in
                    (tmp_path / name / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
        return next(row for row in rows if "train/reward" in row), episodes

    (ruled, episodes), (shifted, _) = (step(name, f"env.reward=reward_fns:{function}") for name, function in
                                       (("ruled", "reply_chars"), ("shifted", "reply_chars_and_a_half")))
    by_hand = [sum(len(m["content"]) for m in e["messages"] if m["role"] == "assistant") / 100 for e in episodes]
    assert [sum(e["turn_rewards"]) for e in episodes] == pytest.approx(by_hand) and len(set(by_hand)) > 1
    assert ruled["train/reward"] == pytest.approx(sum(by_hand) / len(by_hand))
    assert shifted["train/reward"] == pytest.approx(ruled["train/reward"] + 0.5)
    assert ruled["update/trajectories"] > 0
    for key in ("adv/adv_abs_mean", "update/loss", "update/grad_norm", "update/trajectories"):
        assert shifted[key] == pytest.approx(ruled[key], abs=1e-6), key
    (plain, _), (added, _) = step("plain"), step("added", "env.reward=reward_fns:half", "env.reward_mode=add")
    assert added["train/reward"] == pytest.approx(plain["train/reward"] + 0.5)
    # Validation plays the function's reward too.
    validated = [json.loads(line) for line in (tmp_path / "ruled" / "validation" / "step_000001.jsonl")
                 .read_text().splitlines()]
    rows = [json.loads(line) for line in (tmp_path / "ruled" / "metrics.jsonl").read_text().splitlines()]
    by_hand = [sum(len(m["content"]) for m in e["messages"] if m["role"] == "assistant") / 100 for e in validated]
    assert [r["val/reward"] for r in rows if r["step"] == 1 and "val/reward" in r] == \
        [pytest.approx(sum(by_hand) / len(by_hand))]
