"""The success-rate curriculum (`train/curriculum.py`, `curriculum.kind: success`): its formulas by
hand, its draws, and a run whose logged rates are recomputed from its saved episodes."""

from __future__ import annotations

import json
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from agentgym_rl.envs.tasks import Task
from agentgym_rl.train.curriculum import SuccessCurriculum, only_categories, spread_chance
from test_train_e2e import toy_config


def episode(category, success, env_id="counter", error=None):
    return SimpleNamespace(env_id=env_id, category=category, success=success, error=error)


def test_the_chance_of_a_reward_spread_by_hand():
    assert spread_chance(0.5, 4) == pytest.approx(1 - 1 / 16 - 1 / 16)        # 0.875
    assert spread_chance(0.1, 4) == pytest.approx(1 - 0.0001 - 0.6561)         # 0.3438
    assert spread_chance(0.0, 8) == 0.0 and spread_chance(1.0, 8) == 0.0
    assert spread_chance(0.3, 1) == pytest.approx(2 * 0.3 * 0.7)               # groups of one count as two


def test_rates_weigh_earlier_steps_by_memory_and_ignore_the_step_drawn_and_later():
    curriculum = SuccessCurriculum(group_size=4, memory=0.5, explore=0.0)
    curriculum.record(0, [episode("A", True), episode("A", True), episode("A", False), episode("A", False)])
    curriculum.record(1, [episode("A", False)] * 4 + [episode("B", True, error="env died")])
    curriculum.record(2, [episode("A", True)] * 100)  # step 2's own episodes do not steer step 2's draw
    rates = curriculum.rates(2, ["A", "B"])
    # A: successes 0.5 * 2 + 0 = 1, episodes 0.5 * 4 + 4 = 6 -> (1 + 1) / (2 + 6); B: only a failed episode -> prior
    assert rates == {"A": pytest.approx(2 / 8), "B": 0.5}
    assert curriculum.rates(0, ["A"]) == {"A": 0.5}


def test_shares_mix_the_spread_chance_with_an_even_share():
    curriculum = SuccessCurriculum(group_size=4, memory=0.5, explore=0.2)
    curriculum.record(0, [episode("A", True), episode("A", True), episode("A", False), episode("A", False)])
    curriculum.record(1, [episode("A", False)] * 4)
    shares = curriculum.shares(2, ["A", "B"])
    spread_a, spread_b = 1 - 0.25 ** 4 - 0.75 ** 4, 0.875  # A at p = 1/4, B unseen at p = 1/2
    assert shares["A"] == pytest.approx(0.8 * spread_a / (spread_a + spread_b) + 0.1)   # 0.4497...
    assert shares["B"] == pytest.approx(0.8 * spread_b / (spread_a + spread_b) + 0.1)   # 0.5503...
    assert shares["A"] == pytest.approx(0.44975, abs=1e-5)


def test_draws_favour_the_category_with_a_spread_and_never_repeat_a_task():
    pool = [Task("counter", i, "A" if i < 500 else "B") for i in range(1000)]
    curriculum = SuccessCurriculum(group_size=4, memory=0.7, explore=0.0)
    curriculum.record(0, [episode("A", i % 2 == 0) for i in range(100)] + [episode("B", False)] * 100)
    drawn = curriculum.draw(1, pool, 400, random.Random(0))
    assert len({t.index for t in drawn}) == 400
    # spread: A (p = 51/102) 0.875 against B (p = 1/102) 0.038: ~96% of draws; drawn evenly, 50%
    assert Counter(t.category for t in drawn)["A"] > 0.9 * 400
    # every category in play: B once A's tasks run out
    drawn = curriculum.draw(1, pool[:10] + pool[500:], 60, random.Random(0))
    assert len({t.index for t in drawn}) == 60 and Counter(t.category for t in drawn)["A"] == 10


def test_a_steps_draw_depends_only_on_the_steps_before_it_and_the_checkpoint_keeps_those():
    pool = [Task("counter", i, "ABC"[i % 3]) for i in range(60)]
    curriculum = SuccessCurriculum(group_size=4, memory=0.7, explore=0.2)
    curriculum.record(0, [episode("A", True), episode("B", False)])
    before = curriculum.draw(1, pool, 8, random.Random("s-1"))
    curriculum.record(1, [episode("C", True)] * 50)  # step 1 played ahead, then a checkpoint after step 1
    assert curriculum.draw(1, pool, 8, random.Random("s-1")) == before
    saved = curriculum.state_dict(before=1)
    assert saved == {"counts": {0: {"A": [1, 1], "B": [0, 1]}}}
    resumed = SuccessCurriculum(group_size=4, memory=0.7, explore=0.2)
    resumed.load_state_dict(saved)
    assert resumed.draw(1, pool, 8, random.Random("s-1")) == before


def test_a_run_logs_the_shares_and_the_rates_its_saved_episodes_give(tmp_path, counter_env_registered):
    """Three GRPO steps with `curriculum.kind=success`: each step's `curriculum/success/<goal>` is
    (1 + s) / (2 + n) of the episodes saved for the steps before it, weighted by memory; its
    shares sum to 1."""
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "train.steps=3", "train.validate_every=0", "curriculum.kind=success",
                        "curriculum.memory=0.5")
    RLTrainer(config, log=lambda _: None).fit()
    run = tmp_path / "toy"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    goals = ["goal1", "goal2", "goal3"]
    played = []
    for row in rows:
        assert sum(row[f"curriculum/share/{g}"] for g in goals) == pytest.approx(1.0)
        for goal in goals:
            won = sum(0.5 ** (len(played) - 1 - j) * sum(t["success"] for t in step if t["category"] == goal)
                      for j, step in enumerate(played))
            seen = sum(0.5 ** (len(played) - 1 - j) * sum(t["category"] == goal for t in step)
                       for j, step in enumerate(played))
            assert row[f"curriculum/success/{goal}"] == pytest.approx((1 + won) / (2 + seen)), (row["step"], goal)
        path = run / "trajectories" / f"step_{row['step']:06d}.jsonl"
        played.append([json.loads(line) for line in path.read_text().splitlines()])
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert any(r["curriculum/success/goal1"] != 0.5 for r in rows[1:])  # the rates moved off the prior


def test_only_the_named_categories_are_kept_and_a_mix_names_them_with_their_environment():
    tasks = [Task("babyai", 0, "GoTo"), Task("babyai", 1, "Pickup"), Task("textcraft", 2, "depth 1")]
    assert only_categories(tasks, ["GoTo", "depth 1"]) == [tasks[0], tasks[2]]
    assert only_categories(tasks, ["GoTo"], mixed=True) == []
    assert only_categories(tasks, ["babyai/GoTo", "textcraft/depth 1"], mixed=True) == [tasks[0], tasks[2]]


def test_a_run_trains_only_on_the_categories_it_names_and_refuses_one_the_split_lacks(tmp_path, counter_env_registered):
    from agentgym_rl.errors import UserError
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "train.steps=2", "train.validate_every=0", "train.save_every=0",
                        "curriculum.categories=[goal2]")
    RLTrainer(config, log=lambda _: None).fit()
    played = [json.loads(line) for path in sorted((tmp_path / "toy" / "trajectories").glob("step_*.jsonl"))
              for line in path.read_text().splitlines()]
    assert len(played) == 2 * 2 * 3 and {t["category"] for t in played} == {"goal2"}
    wrong = toy_config(tmp_path, "run.name=wrong", "curriculum.categories=[goal2,goal9]")
    with pytest.raises(UserError, match=r"curriculum.categories: train has no category 'goal9'; "
                                        r"it has 'goal1', 'goal2', 'goal3'"):
        RLTrainer(wrong, log=lambda _: None)
    too_few = toy_config(tmp_path, "run.name=few", "curriculum.categories=[goal2]", "algo.tasks_per_step=11")
    with pytest.raises(UserError, match=r"asks for 11 distinct tasks a step from the 10 train tasks in curriculum.categories"):
        RLTrainer(too_few, log=lambda _: None)
