"""SciWorld text environment: item mapping, splits, env contract, rewards, JVM life, expert.

The JVM is slow to start (~1.5 s), so most tests share one env (module fixture)."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections import Counter

import pytest
from scienceworld.constants import ID2TASK

from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvStateError
from agentgym_rl.envs.checker import check_env
from agentgym_rl.envs.sciworld.env import SciWorldEnv, is_failure_message
from agentgym_rl.envs.sciworld.expert import (
    SciWorldExpert,
    _drop_round_trips,
    _squeeze_run,
    _ticks,
    progress,
    shorten,
)
from agentgym_rl.envs.sciworld.items import (
    CATEGORIES,
    EXCLUDED_TASK_IDS,
    NUM_ITEMS,
    TASKS,
    item_index,
    item_task,
    sciworld_tasks,
)
from agentgym_rl.envs.wrappers import TurnLimit

LIFESPAN_ITEM = item_index("7-1", 93)  # longest-lived animal: 3 gold actions, a known score trace
FIND_ITEM = item_index("4-2", 0)  # find a non-living thing: scores 8, 25, 25, 75, 100
FIND_GOLD = ["open door to kitchen", "go to kitchen", "look around", "focus on cupboard",
             "move cupboard to red box"]


@pytest.fixture(scope="module")
def env():
    environment = SciWorldEnv()
    yield environment
    environment.close()


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------ item mapping
def test_item_mapping_is_the_original_flattened_list():
    # The original server: tasks in id order minus the exclusions, every variation.
    kept = [task_id for task_id in ID2TASK if task_id not in EXCLUDED_TASK_IDS]
    assert [task.task_id for task in TASKS] == kept
    assert [task.name for task in TASKS] == [ID2TASK[task_id] for task_id in kept]
    assert NUM_ITEMS == 4639
    assert item_task(0) == (TASKS[0], 0) and TASKS[0].name == "boil"
    assert item_task(29) == (TASKS[0], 29) and item_task(30) == (TASKS[1], 0)
    assert item_task(NUM_ITEMS - 1) == (TASKS[-1], 9) and TASKS[-1].name == "identify-life-stages-2"
    for index in range(0, NUM_ITEMS, 7):
        task, variation = item_task(index)
        assert item_index(task.task_id, variation) == index
    for bad in (-1, NUM_ITEMS):
        with pytest.raises(ValueError):
            item_task(bad)
    with pytest.raises(ValueError):
        item_index("5-1", 0)


def test_splits_sizes_categories_and_determinism():
    test, train = sciworld_tasks("test"), sciworld_tasks("train")
    assert len(test) == 200 and len(train) == 2312
    assert sciworld_tasks("test") == test  # fixed order, call after call
    assert not {t.index for t in test} & {t.index for t in train}
    assert Counter(t.category for t in test) == {"Measure": 66, "Find": 40, "Lifespan": 38, "Test-Cond": 30,
                                                 "Chem-Mix": 26}
    assert {t.category for t in train} == set(CATEGORIES)
    for t in test:
        task, variation = item_task(t.index)
        assert variation in task.test_variations and t.category == task.category
    assert all(item_task(t.index)[1] < item_task(t.index)[0].train_end for t in train)
    # Round-robin: the first 23 test items are the first test variation of every task.
    assert [item_task(t.index) for t in test[:23]] == [(task, task.dev_end) for task in TASKS]
    assert test[0].item_id == "sciworld_21"
    with pytest.raises(ValueError):
        sciworld_tasks("dev")


def test_registered():
    assert "sciworld" in registry.env_ids()
    assert registry.spec("sciworld").max_turns == 100
    assert registry.tasks("sciworld", "test") == sciworld_tasks("test")
    wrapped = registry.make("sciworld", max_turns=5, reward="success")
    assert isinstance(wrapped, TurnLimit) and wrapped.unwrapped.reward_mode == "success"
    assert wrapped.unwrapped.jvm_pid is None  # no JVM before the first reset
    with pytest.raises(ValueError):
        SciWorldEnv(reward="dense")
    with pytest.raises(ValueError):
        SciWorldEnv(simplification="openDoors,fly")


def test_task_table_matches_the_package(env):
    env.reset(LIFESPAN_ITEM)
    server = env._sim.server
    for task in TASKS:
        assert server.getTaskMaxVariations(task.name) == task.variations, task.name


@pytest.mark.slow
def test_split_bounds_match_the_package(env):
    env.reset(LIFESPAN_ITEM)
    server = env._sim.server
    for task in TASKS:
        server.load(task.name, 0, "", False)
        assert list(server.getVariationsTrain()) == list(range(task.train_end)), task.name
        assert list(server.getVariationsDev()) == list(range(task.train_end, task.dev_end)), task.name
        assert list(server.getVariationsTest()) == list(task.test_variations), task.name


# ------------------------------------------------------------------------ env contract
def test_check_env_passes(env):
    env.close()  # as good as new: the next reset starts a JVM
    check_env(env, item_id=LIFESPAN_ITEM)


def test_a_snapshot_is_a_replay_that_reaches_the_same_state(env):
    env.reset(3)
    for _ in range(4):
        env.step(env.expert_action())
    state, action = env.snapshot(), env.expert_action()
    after = env.step(action)
    env.reset(7)  # another task in between: the restore loads the snapshot's own
    env.restore(state)
    again = env.step(action)
    assert again[0] == after[0] and again[1:4] == after[1:4] and again[4]["score"] == after[4]["score"]


def test_reset_observation_and_info(env):
    obs, info = env.reset(f"sciworld_{LIFESPAN_ITEM}")
    description, look = obs.split("\n", 1)
    assert description.startswith("Your task is to find the animal with the longest life span.")
    assert look.startswith("This room is called the greenhouse.")
    assert info == {"item_id": f"sciworld_{LIFESPAN_ITEM}", "task_id": "7-1",
                    "task_name": "lifespan-longest-lived", "variation": 93, "category": "Lifespan",
                    "score": 0, "success": False, "task_description": description}


def test_available_actions_are_commands_on_the_things_in_reach(env):
    env.reset(LIFESPAN_ITEM)
    listed = env.available_actions()
    assert len(listed) > 100 and len(set(listed)) == len(listed)
    assert {"look around", "open door to outside", "inventory", "wait"} <= set(listed)
    assert "reset task" not in listed and not [a for a in listed if "OBJ" in a or "LOC" in a]
    assert "go to outside" not in listed  # its door is closed
    assert env.available_actions() == listed and env.available_actions() is not env.available_actions()
    # Well-formed on what is here, not all possible: the simulator still refuses some.
    assert "connect bee 4 to air" in listed and env.step("connect bee 4 to air")[4]["invalid_action"]
    env.step("open door to outside")
    assert "go to outside" in env.available_actions()  # asked again: the state changed


def test_reset_is_deterministic_and_reuses_the_jvm(env):
    first, _ = env.reset(FIND_ITEM)
    pid, threads = env.jvm_pid, threading.active_count()
    for _ in range(3):
        env.reset(LIFESPAN_ITEM)
        env.step("open door to outside")
        assert env.reset(FIND_ITEM)[0] == first
    assert env.jvm_pid == pid and threading.active_count() == threads


def test_reset_without_item_picks_a_train_item_from_the_seed(env):
    _, info = env.reset(seed=3)
    index = int(info["item_id"].removeprefix("sciworld_"))
    assert index in {t.index for t in sciworld_tasks("train")}
    assert env.reset(seed=3)[1]["item_id"] == info["item_id"]


NO_ACTION = "Your reply held no action. Reply with one action, e.g. `look around`."


@pytest.mark.parametrize(
    "action, answer",
    [
        ("dance", "No known action matches that input."),
        ("go to kitchen", "The door is not open."),  # the door is closed
        ("open door to the moon", "No known action matches that input."),
        ("", NO_ACTION),
        ("Thought: nothing to do.\nAction:", NO_ACTION),
    ],
)
def test_invalid_actions_are_answered_not_raised(env, action, answer):
    env.reset(FIND_ITEM)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == answer
    assert info["invalid_action"] is True and info["success"] is False and info["score"] == 0
    assert reward == 0.0 and not terminated and not truncated


def test_react_reply_and_loose_spelling(env):
    env.reset(FIND_ITEM)
    obs, _, _, _, info = env.step("Thought: the kitchen is next door.\nAction: Open door to kitchen.")
    assert obs == "The door is now open." and not info["invalid_action"]
    obs, _, _, _, info = env.step("go  to kitchen")
    assert obs == "You move to the kitchen." and info["score"] == 25


def test_ambiguous_command_asks_and_another_command_cancels(env):
    env.reset(LIFESPAN_ITEM)
    obs, _, _, _, info = env.step("look at door")
    assert obs.startswith("Ambiguous request") and "0:\tlook at door between greenhouse and hallway" in obs
    assert info["invalid_action"] and info["ambiguous"]
    assert env.available_actions() == ["0", "1"]  # the simulator lists only its choices then
    obs, _, _, _, info = env.step("1")  # answering with the number
    assert obs == "A door to the outside (that is closed)" and not info["invalid_action"]
    env.step("look at door")
    obs, _, _, _, info = env.step("open door to outside")  # ignoring the question
    assert obs == "The door is now open." and not info["invalid_action"] and not info["ambiguous"]


def test_failure_messages():
    for text in ("No known action matches that input.", "The door is not open.", "The cupboard is already open.",
                 "It's not clear how to read that.", "You can't pick up a gas directly.",
                 "Ambiguous request: Please enter the number"):
        assert is_failure_message(text), text
    look = "This room is called the kitchen. In it, you see: \n\ta fridge. The fridge door is closed.\n\talready"
    for text in ("The door is now open.", "You move to the kitchen.", look):
        assert not is_failure_message(text), text


# ------------------------------------------------------------------------------ rewards
@pytest.mark.parametrize(
    "mode, rewards",
    [
        ("raw", [8, 17, 0, 50, 25]),
        ("score", [0.08, 0.17, 0.0, 0.5, 0.25]),
        ("success", [0, 0, 0, 0, 1]),
    ],
)
def test_reward_modes_on_a_solved_item(env, mode, rewards):
    env.reward_mode = mode
    try:
        env.reset(FIND_ITEM)
        results = [env.step(action) for action in FIND_GOLD]
    finally:
        env.reward_mode = "score"
    assert [r[1] for r in results] == pytest.approx(rewards)
    assert [r[4]["score"] for r in results] == [8, 25, 25, 75, 100]
    assert [r[2] for r in results] == [False] * 4 + [True]
    assert [r[4]["success"] for r in results] == [False] * 4 + [True]
    with pytest.raises(EnvStateError):
        env.step("look around")


def test_rewards_are_only_for_what_the_agent_did(env):
    """In 3-1 the agent starts in the workshop, a sub-goal the first look already scores (7):
    that is never paid, not even to a first action the simulator rejects; the gold path's
    rewards add up to the final score less those 7."""
    env.reward_mode = "raw"
    try:
        _, info = env.reset(item_index("3-1", 15))
        assert info["score"] == 7
        _, reward, _, _, rejected = env.step("jump over the moon")
        assert rejected["invalid_action"] and reward == 0 and rejected["score"] == 7
        env.reset(item_index("3-1", 15))
        gold = [action for action in env.gold_actions() if action != "look around"]
        results = [env.step(action) for action in gold[:5]]
    finally:
        env.reward_mode = "score"
    assert results[-1][2] and results[-1][4]["success"]
    assert results[0][1] == results[0][4]["score"] - 7
    assert sum(r[1] for r in results) == 100 - 7


@pytest.mark.parametrize("mode, last", [("raw", -150.0), ("score", -0.5), ("success", 0.0)])
def test_reward_modes_on_a_failed_item(env, mode, last):
    """Focusing on the wrong thing sets the score to -100 and ends the task."""
    env.reward_mode = mode
    try:
        env.reset(LIFESPAN_ITEM)
        env.step("open door to outside")
        _, reward, _, _, info = env.step("go to outside")
        assert info["score"] == 50
        obs, reward, terminated, truncated, info = env.step("focus on axe")
    finally:
        env.reward_mode = "score"
    assert obs == "You focus on the axe." and terminated and not truncated
    assert info["score"] == -100 and info["success"] is False and not info["invalid_action"]
    assert reward == pytest.approx(last)


# ----------------------------------------------------------------------------- JVM life
def test_close_is_idempotent_and_stops_the_jvm():
    environment = SciWorldEnv()
    environment.reset(LIFESPAN_ITEM)
    pid = environment.jvm_pid
    assert alive(pid)
    environment.close()
    environment.close()
    assert environment.jvm_pid is None and not alive(pid)
    with pytest.raises(EnvStateError):
        environment.step("look around")
    obs, _ = environment.reset(LIFESPAN_ITEM)  # usable again: a new JVM
    assert obs.startswith("Your task is") and alive(environment.jvm_pid)
    environment.close()


def test_a_forgotten_env_whose_jvm_died_is_collected_without_a_word_from_py4j(caplog):
    """The garbage collector may run inside any code (once, inside hypothesis's `compile`): a
    collected simulator must not try to reach its dead JVM and log the refused connection."""
    environment = SciWorldEnv()
    environment.reset(LIFESPAN_ITEM)
    pid = environment.jvm_pid
    os.kill(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.05)
    in_a_cycle = [environment]
    in_a_cycle.append(in_a_cycle)
    with caplog.at_level(logging.INFO, logger="py4j"):
        del environment, in_a_cycle
        gc.collect()
    assert not [record.getMessage() for record in caplog.records if record.name.startswith("py4j")]


def test_step_before_reset_raises():
    with pytest.raises(EnvStateError):
        SciWorldEnv().step("look around")


def test_killed_jvm_is_replaced_and_the_episode_goes_on(env):
    env.reset(FIND_ITEM)
    expected = [env.step(action) for action in FIND_GOLD[:4]]
    env.reset(FIND_ITEM)
    env.step(FIND_GOLD[0])
    env.step(FIND_GOLD[1])
    old, restarts = env.jvm_pid, env.restarts
    os.kill(old, signal.SIGKILL)
    again = [env.step(action) for action in FIND_GOLD[2:4]]
    assert env.restarts == restarts + 1 and env.jvm_pid != old and not alive(old)
    assert [r[:4] for r in again] == [r[:4] for r in expected[2:4]]  # same observations, rewards
    assert again[-1][4]["score"] == 75 and again[-1][4]["jvm_restarts"] == restarts + 1


def test_killed_jvm_between_episodes_is_replaced_on_reset(env):
    first, _ = env.reset(LIFESPAN_ITEM)
    old = env.jvm_pid
    os.kill(old, signal.SIGKILL)
    assert env.reset(LIFESPAN_ITEM)[0] == first and env.jvm_pid != old and not alive(old)


# -------------------------------------------------------------------------------- expert
def test_shorten_keeps_time_exact():
    heating = ["examine lead", "use thermometer in inventory on lead"] * 2 + [
        "examine lead", "use thermometer in inventory on liquid lead"]
    assert _squeeze_run(heating) == ["wait1", "wait1", *heating[-2:]]
    cooling = ["examine water", "use thermometer in inventory on water", "wait"] * 19 + ["examine ice"]
    squeezed = _squeeze_run(cooling)
    assert sum(map(_ticks, squeezed)) == sum(map(_ticks, cooling)) and squeezed[-1] == "examine ice"
    assert len(squeezed) == 26
    assert _squeeze_run(["wait1"] * 8) == ["wait1"] * 8  # 16 steps: nothing shorter is exact


def test_shorten_drops_looks_and_round_trips():
    gold = ["open door to kitchen", "go to kitchen", "look around", "open door to bathroom", "go to bathroom",
            "look around", "open door to kitchen", "go to kitchen", "pick up thermometer"]
    assert shorten(gold) == ["open door to kitchen", "go to kitchen", "pick up thermometer"]
    assert _drop_round_trips(gold[:2]) == gold[:2]


def test_progress_skips_off_plan_actions():
    plan = ["open door to kitchen", "go to kitchen", "focus on cupboard"]
    assert progress(plan, ["look around", "open door to kitchen", "dance", "go to kitchen"]) == 2
    assert progress(plan, []) == 0


def test_expert_solves_two_items(env):
    expert, limited = SciWorldExpert(), TurnLimit(env, 100)
    for item, most in ((LIFESPAN_ITEM, 3), (item_index("6-2", 27), 15)):
        limited.reset(item)
        for turn in range(100):
            reply = expert.act(limited)
            assert reply.startswith("Thought: ") and "\nAction: " in reply
            obs, _, terminated, truncated, info = limited.step(reply)
            assert not info["invalid_action"], (reply, obs)
            if terminated or truncated:
                break
        assert info["success"] and turn + 1 <= most, (item, turn)


@pytest.mark.slow
def test_expert_solves_one_test_item_of_every_task(env):
    expert, max_turns = SciWorldExpert(), registry.spec("sciworld").max_turns
    failed = []
    for task in sciworld_tasks("test")[:23]:
        env.reset(task.index)
        for _ in range(max_turns):
            _, _, terminated, _, info = env.step(expert.act(env))
            if terminated:
                break
        if not info["success"]:
            failed.append(task.item_id)
    assert not failed
