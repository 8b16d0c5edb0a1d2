"""Several environments in one run (`env.id: mix`): the tasks, the environment, the quotas."""

from __future__ import annotations

import pytest

from agentgym_rl.envs import registry
from agentgym_rl.envs.babyai.env import BabyAIEnv
from agentgym_rl.envs.mix import MixEnv, interleave, member_quotas, mix_tasks, parse_members
from agentgym_rl.envs.textcraft.env import TextCraftEnv

MEMBERS = [{"id": "babyai", "weight": 1, "kwargs": {"list_actions": True}, "max_turns": 3},
           {"id": "textcraft", "weight": 1}]


def test_member_quotas_by_hand():
    # Shares 1.5, 1.5, 3: floors 1, 1, 3; the one task left goes to the larger remainder, the first on a tie.
    assert member_quotas([1, 1, 2], 6) == [2, 1, 3]
    assert member_quotas([1, 1], 7) == [4, 3] and member_quotas([1, 3], 1) == [0, 1]
    assert member_quotas([1.0], 8) == [8]


def test_interleave_follows_the_weights_then_drains_what_is_left():
    assert interleave([["a1", "a2", "a3", "a4"], ["b1", "b2"]], [1, 1]) == ["a1", "b1", "a2", "b2", "a3", "a4"]
    assert interleave([["a1", "a2", "a3", "a4"], ["b1", "b2", "b3"]], [2, 1]) == \
        ["a1", "b1", "a2", "a3", "b2", "a4", "b3"]


def test_the_mixs_tasks_are_its_members_interleaved():
    babyai, textcraft = registry.tasks("babyai", "test"), registry.tasks("textcraft", "test")
    mixed = registry.tasks("mix", "test", {"members": MEMBERS})
    assert len(mixed) == len(babyai) + len(textcraft)
    assert [t.item_id for t in mixed[:4]] == [babyai[0].item_id, textcraft[0].item_id, babyai[1].item_id,
                                              textcraft[1].item_id]
    assert [t for t in mixed if t.env_id == "textcraft"] == textcraft  # each member's in its own order
    assert mix_tasks("test", MEMBERS) == mixed


def test_the_mix_plays_each_task_in_its_member_with_the_members_turn_limit_and_prompt():
    env = MixEnv(MEMBERS)
    try:
        observation, info = env.reset("textcraft_3")
        assert observation.startswith("Crafting commands:") and info["env_id"] == "textcraft"
        assert env.instruction == TextCraftEnv.instruction and env.expert_action()
        observation, info = env.reset("babyai_0")
        assert info["env_id"] == "babyai" and info["state_key"]
        assert env.instruction == BabyAIEnv.instruction
        assert "go to" in " ".join(env.available_actions())
        # babyai's limit here is 3 turns (TurnLimit), whatever the engine's horizon.
        results = [env.step("turn left") for _ in range(3)]
        assert [r[3] for r in results] == [False, False, True]
    finally:
        env.close()


@pytest.mark.parametrize("members,message", [
    (None, "needs env.kwargs.members"),
    ([{"id": "chess"}], "'chess' is not an environment"),
    ([{"id": "babyai", "weight": 0}], "weight must be > 0"),
    ([{"id": "babyai", "max_turns": 0}], "max_turns must be a positive integer"),
    ([{"id": "babyai", "turns": 3}], "unknown key"),
    ([{"id": "babyai", "weight": "a lot"}], "weight is a number and kwargs a mapping"),
    ([{"id": "babyai", "kwargs": [1]}], "weight is a number and kwargs a mapping"),
    ([{"id": "babyai"}, {"id": "babyai"}], "may be a member once"),
])
def test_bad_members_are_named(members, message):
    with pytest.raises(ValueError, match=message):
        parse_members(members)


def test_a_task_of_no_member_is_refused():
    env = MixEnv(MEMBERS)
    with pytest.raises(ValueError, match="not a task of this mix's members"):
        env.reset("sciworld_1")
    with pytest.raises(ValueError, match="'<env>_<index>'"):
        env.reset(3)


def test_a_bad_argument_of_a_member_is_an_error_before_any_work():
    from agentgym_rl.errors import UserError

    with pytest.raises(UserError, match="member 'babyai'.*colour"):
        registry.env_factory("mix", {"members": [{"id": "babyai", "kwargs": {"colour": 1}}, {"id": "textcraft"}]})
    factory = registry.env_factory("mix", {"members": MEMBERS})
    assert factory.max_parallel == 0  # neither member limits its instances
    assert factory().reset("textcraft_1")[1]["env_id"] == "textcraft"


def test_the_refills_of_dynamic_sampling_keep_the_mixs_weights(tmp_path):
    from pathlib import Path

    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train.rl import RLTrainer

    config = load_config(RLConfig, Path(__file__).resolve().parent.parent / "configs" / "mix_grpo.yaml", [
        f"run.output_dir={tmp_path}", "algo.dynamic_sampling=2",
        "env.kwargs={members: [{id: babyai, weight: 3}, {id: textcraft, weight: 1}]}"])
    trainer = RLTrainer(config, log=lambda _: None)
    played = trainer.sample_tasks(3)
    refill = trainer.refill_tasks(step=3, round_=1, count=8, played=played)
    assert [task.env_id for task in refill].count("babyai") == 6 and len(refill) == 8
    assert not {task.item_id for task in refill} & {task.item_id for task in played}
    assert refill == trainer.refill_tasks(step=3, round_=1, count=8, played=played)
