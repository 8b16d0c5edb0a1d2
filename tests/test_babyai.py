"""BabyAI text environment: item mapping, renderer, actions, env contract and expert."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from minigrid.core.grid import Grid
from minigrid.core.world_object import Ball, Door, Key
from minigrid.envs import EmptyEnv

from agentgym_rl.envs import registry
from agentgym_rl.envs.babyai.actions import Command, execute, parse_action, plan_path
from agentgym_rl.envs.babyai.env import BabyAIEnv
from agentgym_rl.envs.babyai.levels import CATEGORIES, LEVELS, babyai_tasks, item_level
from agentgym_rl.envs.babyai.render import describe, observe
from agentgym_rl.envs.base import EnvExpert, EnvStateError
from agentgym_rl.envs.checker import check_env
from agentgym_rl.envs.parsing import action_token, drop_thought, extract_action, first_wrong_token, right_next_tokens
from agentgym_rl.envs.wrappers import TurnLimit


@pytest.fixture()
def env():
    environment = BabyAIEnv()
    yield environment
    environment.close()


def tiny_state():
    """A 7x7 room: agent at (2, 4) facing up, a red ball at (3, 2), a grey door at (0, 3)."""
    state = EmptyEnv(size=7)
    state.reset(seed=0)
    state.grid = Grid(7, 7)
    state.grid.wall_rect(0, 0, 7, 7)
    state.grid.set(3, 2, Ball("red"))
    state.grid.set(0, 3, Door("grey"))
    state.agent_pos, state.agent_dir = (2, 4), 3
    state.mission = "go to the red ball"
    return state


# ------------------------------------------------------------------------ item mapping
def test_item_mapping_level_and_seed():
    assert item_level(0) == (LEVELS[0], 0)
    assert item_level(40) == (LEVELS[0], 1)
    assert item_level(93) == (LEVELS[13], 2)
    with pytest.raises(ValueError):
        item_level(10_000)


def test_levels_table_is_40_registered_levels():
    assert len(LEVELS) == 40 and len({level.name for level in LEVELS}) == 40
    for level in LEVELS:
        assert level.gym_id in gym.registry, level.gym_id
        assert level.category in CATEGORIES


def test_splits():
    test, train = babyai_tasks("test"), babyai_tasks("train")
    assert [task.index for task in test] == list(range(90))
    assert train[0].index == 90 and train[-1].index == 9999 and len(train) == 9910
    assert test[0].item_id == "babyai_0"
    assert {task.category for task in test} == set(CATEGORIES)
    assert all(task.category == item_level(task.index)[0].category for task in test)
    with pytest.raises(ValueError):
        babyai_tasks("dev")


def test_items_0_and_40_are_one_level_with_seeds_0_and_1(env):
    obs0, info0 = env.reset(0)
    obs40, info40 = env.reset("babyai_40")
    assert info0["level"] == info40["level"] == LEVELS[0].name
    assert info0["item_id"] == "babyai_0" and info40["item_id"] == "babyai_40"
    grid0 = gym.make(LEVELS[0].gym_id, disable_env_checker=True).unwrapped
    grid0.reset(seed=1)
    assert np.array_equal(grid0.grid.encode(), env.minigrid_env.grid.encode())


# ----------------------------------------------------------------------------- renderer
def test_renderer_on_a_hand_built_state():
    text = describe(observe(tiny_state()))
    lines = text.split("\n")
    assert lines[0] == "Your goal: go to the red ball"
    assert lines[1] == (
        "You can see: a grey closed door 1 1 steps in front of you and 2 steps to your left; "
        "a red ball 1 2 steps in front of you and 1 steps to your right. "
        "You are facing a wall 4 steps away. You are not carrying anything."
    )
    assert json.loads(lines[2].removeprefix("Available actions: ")) == [
        "turn left", "turn right", "move forward",
        "go to grey door 1", "toggle and go through grey door 1",
        "go to red ball 1", "pickup red ball 1",
        "check available actions",
    ]


def test_renderer_hides_what_is_behind_the_agent_and_numbers_same_objects():
    state = tiny_state()
    state.grid.set(2, 5, Key("blue"))  # directly behind the agent: out of view
    state.grid.set(4, 3, Ball("red"))  # 1 ahead, 2 right: distance 3 = the other red ball's
    view = observe(state)
    labels = [obj.label for obj in view.objects]
    assert "blue key 1" not in labels
    # Same distance: sorted by name, then by position (steps ahead first).
    assert labels == ["grey door 1", "red ball 1", "red ball 2"]
    assert view.find("red", "ball", 1).pos == (4, 3)


def test_renderer_carrying_and_facing_an_object():
    state = tiny_state()
    state.agent_pos = (3, 3)  # the red ball is now directly in front
    state.carrying = Key("yellow")
    text = describe(observe(state))
    seen = "You can see: a red ball 1 1 steps in front of you; a grey closed door 1 3 steps to your left."
    assert seen in text
    assert "You are facing the red ball 1, 1 steps away." in text
    assert "You are carrying a yellow key." in text
    assert '"drop"' in text and '"pickup red ball 1"' not in text


# ------------------------------------------------------------------------------ actions
@pytest.mark.parametrize(
    "text, expected",
    [
        ("turn left", Command("turn left")),
        ("Move Forward.", Command("move forward")),
        ("pick up", Command("pickup")),
        ("go to red ball 1", Command("go to", "red", "ball", 1)),
        ("go to the gray key", Command("go to", "grey", "key", 1)),
        ("pickup blue box 2", Command("pickup", "blue", "box", 2)),
        ("toggle and go through yellow door 3", Command("go through", "yellow", "door", 3)),
        ("go through red door 1", Command("go through", "red", "door", 1)),
        ("check available actions", Command("check available actions")),
        ("dance", None),
        ("go to red", None),
        ("", None),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_go_to_faces_the_object_by_a_shortest_path():
    state = tiny_state()
    seen = np.ones((7, 7), dtype=bool)
    path = plan_path(state, seen, (3, 2))
    # From (2, 4) facing up: forward twice to (2, 2), then turn right to face (3, 2).
    assert path == [2, 2, 1]
    outcome = execute(parse_action("go to red ball 1"), state, seen)
    assert outcome.error is None and len(outcome.primitives) == 3
    assert tuple(state.front_pos) == (3, 2)


def two_rooms(door: Door):
    """The tiny room widened to 9x7 with a wall at x = 4 and `door` at (4, 2)."""
    state = tiny_state()
    state.grid, state.width = Grid(9, 7), 9
    state.grid.wall_rect(0, 0, 9, 7)
    state.grid.vert_wall(4, 0)
    state.grid.set(4, 2, door)
    return state


def test_go_through_opens_the_door_and_steps_past_it():
    state = two_rooms(Door("grey"))
    seen = np.ones((9, 7), dtype=bool)
    outcome = execute(parse_action("toggle and go through grey door 1"), state, seen)
    assert outcome.error is None
    assert state.grid.get(4, 2).is_open
    assert tuple(state.agent_pos) == (5, 2) and state.agent_dir == 0


def test_locked_door_needs_the_key_of_its_color():
    state = two_rooms(Door("grey", is_locked=True))
    seen = np.ones((9, 7), dtype=bool)
    outcome = execute(parse_action("go through grey door 1"), state, seen)
    assert outcome.error == "the grey door 1 is locked and you do not carry a grey key"
    assert outcome.primitives == [] and tuple(state.agent_pos) == (2, 4)
    state.carrying = Key("grey")
    outcome = execute(parse_action("go through grey door 1"), state, seen)
    assert outcome.error is None and state.grid.get(4, 2).is_open
    assert tuple(state.agent_pos) == (5, 2)


def test_go_to_object_in_view(env):
    env.reset(0)
    view = observe(env.minigrid_env)
    target = next(obj for obj in view.objects if obj.color == "grey")
    obs, reward, terminated, truncated, info = env.step(f"go to {target.label}")
    assert not info["invalid_action"] and info["primitive_steps"] > 0
    assert tuple(env.minigrid_env.front_pos) == target.pos


@pytest.mark.parametrize(
    "action, reason",
    [
        ("jump around", "that is not a valid action"),
        ("go to blue key 7", "there is no blue key 7 in view"),
        ("pickup", "there is nothing to pick up in front of you"),
        ("drop", "you are not carrying anything"),
        ("toggle", "there is no door or box in front of you"),
    ],
)
def test_invalid_actions_are_explained_not_raised(env, action, reason):
    first, _ = env.reset(0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["invalid_action"] is True and info["success"] is False
    assert info["primitive_steps"] == 0 and reward == 0.0
    assert obs == f"You cannot do that: {reason}. {first}"
    assert not terminated and not truncated


def test_discovered_counts_the_cells_a_step_shows_for_the_first_time(env):
    """`info["discovered"]` is the growth of the seen cells: a turn shows cells behind the first
    view, a turn back shows none (the start's view again), a rejected action none."""
    env.reset(3)
    start = int(env.seen_mask.sum())
    turned = env.step("turn left")[4]["discovered"]
    assert turned > 0 and int(env.seen_mask.sum()) == start + turned
    assert env.step("turn right")[4]["discovered"] == 0
    rejected = env.step("pickup")[4]
    assert rejected["invalid_action"] and rejected["discovered"] == 0
    assert registry.spec("babyai").discoveries and not registry.spec("textcraft").discoveries


def test_the_state_key_names_the_true_state_not_the_view(env):
    start = env.reset(40)[1]["state_key"]
    assert env.reset(40)[1]["state_key"] == start and env.reset(0)[1]["state_key"] != start
    env.reset(40)
    # A rejected action leaves the state, so the key, as it was; turning changes only the pose.
    assert env.step("pickup")[4]["state_key"] == start
    turned = env.step("turn left")[4]["state_key"]
    assert turned != start
    # Back to the same pose: the same key, though the view history differs.
    assert env.step("turn right")[4]["state_key"] == start
    assert registry.spec("babyai").state_keys


def test_a_snapshot_restores_the_state_in_this_or_another_instance(env, monkeypatch):
    env.reset(40)
    env.step("turn left")
    state, key = env.snapshot(), env.state_key()
    moved = env.step("move forward")[0]
    env.restore(state)
    assert env.state_key() == key and env.step("move forward")[0] == moved
    other = BabyAIEnv()
    other.reset(3)
    other.restore(state)  # a fork: the other instance continues the episode; this one is untouched
    assert other.state_key() == key and other.step("move forward")[0] == moved
    assert other.primitive_history == env.primitive_history
    # The expert plans from a restored state as from any other.
    assert other.expert_action()
    with pytest.raises(ValueError, match="'textcraft' cannot be restored into 'babyai'"):
        from agentgym_rl.envs.textcraft.env import TextCraftEnv

        crafting = TextCraftEnv()
        crafting.reset(0)
        env.restore(crafting.snapshot())
    # check_env catches a restore that does nothing.
    monkeypatch.setattr(BabyAIEnv, "restore", lambda self, state: None)
    with pytest.raises(AssertionError, match="after restore"):
        check_env(BabyAIEnv(), item_id=3)


def test_pickup_of_a_door_and_while_carrying_are_invalid():
    state = tiny_state()
    seen = np.ones((7, 7), dtype=bool)
    outcome = execute(parse_action("pickup grey door 1"), state, seen)
    assert outcome.error == "the grey door 1 cannot be picked up"
    state.carrying = Key("yellow")
    outcome = execute(parse_action("pickup red ball 1"), state, seen)
    assert outcome.error == "you are already carrying a yellow key"


def test_react_reply_goes_through_extract_action(env):
    env.reset(0)
    direction = env.minigrid_env.agent_dir
    obs, reward, terminated, truncated, info = env.step("Thought: I should look left.\nAction: turn left")
    assert not info["invalid_action"] and info["primitive_steps"] == 1
    assert env.minigrid_env.agent_dir == (direction - 1) % 4


def test_step_names_the_kind_of_action_however_it_was_written(env):
    env.reset(0)
    kinds = [env.step(reply)[4]["action_kind"] for reply in
             ("Action: pick up", "Action: pickup", "Action: Turn Left", "Action: dance", "Action: go to red ball 9")]
    assert kinds == ["pickup", "pickup", "turn left", "", "go to"]


@pytest.mark.parametrize("text, expected", [
    ("Thought: I need to go to the red ball.\nAction: go to red ball 1", "Action: go to red ball 1"),
    ("Thought: first\nAction: turn left\nThought: no\naction: turn right", "action: turn right"),
    ("turn left", "turn left"),
])
def test_drop_thought_keeps_the_acted_line(text, expected):
    assert drop_thought(text) == expected
    assert extract_action(drop_thought(text)) == extract_action(text)


REPLY_TOKENS = ["Thought", ": look", "\n", "Action", ":", " go", " to", " grey", " key", " 1"]


@pytest.mark.parametrize("actions, expected", [
    (["turn left", "go to green key 1"], 7),  # "gre" matches green; the token bringing "y" is wrong
    (["pickup grey key 1"], 5),               # wrong from the action's first token
    (["go to grey key 1", "turn left"], None),  # a listed action the environment refused
    (["go to grey key 10"], 9),               # stopped short of a listed action: the last token
    ([], None),
])
def test_first_wrong_token_finds_where_the_action_left_every_available_one(actions, expected):
    def decode(ids):
        return "".join(REPLY_TOKENS[i] for i in ids)

    assert first_wrong_token(list(range(len(REPLY_TOKENS))), decode, actions) == expected


@pytest.mark.parametrize("tokens, finished, expected", [
    (["Action", ":", " go", " to", "\n", "Then"], True, 4),       # the line ended the action: its "\n"
    (["Action", ":", " go", " to", "<stop>"], True, 4),             # the stop token ended it
    (["Action", ":", " go", " to", " grey"], False, None),          # the token limit cut a right start
    (["Action", ":", " go", " to", " gray"], False, 4),             # a wrong token before the cut is still wrong
])
def test_an_action_that_stops_short_went_wrong_where_it_ended(tokens, finished, expected):
    def decode(ids):  # the stop token decodes to nothing, as tokenizers skip special tokens
        return "".join(tokens[i] for i in ids if tokens[i] != "<stop>")

    assert first_wrong_token(list(range(len(tokens))), decode, ["go to grey key 1"], finished) == expected


@pytest.mark.parametrize("tokens, expected", [
    (["Thought", ": look", "\n", "You", " see"], 3),   # the line after the thought is not an action
    (["Thought", ": look", "\n\n", " You"], 3),         # blank space before it is passed over
    (["Thought", ": look", " at", " it"], None),         # a thought and nothing else
    (["Thought", ": look", "\n", "\n"], None),
    (["You", " see", " a", " key"], 0),                   # no thought: read as a bare action, as before
])
def test_a_thought_without_an_action_line_went_wrong_where_the_action_line_should_begin(tokens, expected):
    def decode(ids):
        return "".join(tokens[i] for i in ids)

    assert first_wrong_token(list(range(len(tokens))), decode, ["turn left", "go to grey key 1"]) == expected


@pytest.mark.parametrize("tokens, expected", [
    (REPLY_TOKENS, 5),                      # " go" brings the action's first letter
    (["Action", ": turn", " left"], 1),     # a token that also brings the line's colon
    (["turn", " left"], 0),                 # a bare action
    (["Action", ":", " "], None),           # an empty Action line: no action
])
def test_action_token_is_where_the_reply_chose_its_action(tokens, expected):
    def decode(ids):
        return "".join(tokens[i] for i in ids)

    assert action_token(list(range(len(tokens))), decode) == expected


WORDS = REPLY_TOKENS + [" green", " red", " ball", " pickup", " 10", " turn", " left"]


def encode_words(text):
    """A tokenizer over WORDS, longest match first."""
    ids = []
    while text:
        best = max((i for i, w in enumerate(WORDS) if text.startswith(w)), key=lambda i: len(WORDS[i]))
        ids.append(best)
        text = text[len(WORDS[best]):]
    return ids


@pytest.mark.parametrize("wrong, actions, expected", [
    (7, ["turn left", "go to green key 1", "go to red ball 1", "go to green ball 1"], [" green", " red"]),
    (5, ["pickup grey key 1", "turn left"], []),  # wrong at the action's first token: no repair
    (9, ["go to grey key 10"], [" 10"]),  # stopped short: the longer last token
    (7, ["turn left"], []),  # no listed action shares the prefix
])
def test_right_next_tokens_are_those_of_listed_actions_sharing_the_prefix(wrong, actions, expected):
    def decode(ids):
        return "".join(WORDS[i] for i in ids)

    reply = list(range(len(REPLY_TOKENS)))
    assert encode_words(decode(reply)) == reply
    right = right_next_tokens(reply, wrong, decode, encode_words, actions)
    assert [WORDS[i] for i in right] == expected


def test_check_available_actions_takes_no_step(env):
    obs, _ = env.reset(0)
    result = env.step("check available actions")
    assert result[0] == obs and result[4]["primitive_steps"] == 0 and not result[4]["invalid_action"]
    assert env.available_actions() == json.loads(obs.split("Available actions: ")[1])


# ---------------------------------------------------------------------------- env contract
def test_check_env_passes():
    check_env(BabyAIEnv())


def test_reset_is_deterministic_per_item():
    first, second = BabyAIEnv(), BabyAIEnv()
    for item in (3, 57, 1234):
        assert first.reset(item) == second.reset(item)
        assert first.reset(item)[0] == first.reset(f"babyai_{item}")[0]


def test_reset_without_item_picks_a_train_item_from_the_seed(env):
    _, info = env.reset(seed=5)
    index = int(info["item_id"].removeprefix("babyai_"))
    assert 90 <= index < 10_000 and env.reset(seed=5)[1]["item_id"] == info["item_id"]


def test_success_reward_and_end_of_episode(env):
    env.reset(0)  # GoToRedBallGrey: "go to the red ball", visible from the start
    assert LEVELS[0].name == "GoToRedBallGrey"
    obs, reward, terminated, truncated, info = env.step("go to red ball 1")
    steps = info["primitive_steps"]
    assert info["success"] and terminated and obs.startswith("You completed the mission.")
    assert reward == pytest.approx(1 - 0.9 * steps / env.minigrid_env.max_steps)
    with pytest.raises(EnvStateError):
        env.step("turn left")
    env.close()
    env.close()
    with pytest.raises(EnvStateError):
        env.step("turn left")


def test_sampling_rejected_is_not_printed(capsys):
    index = next(i for i, level in enumerate(LEVELS) if level.name == "GoToObjDoor")
    raw = gym.make(LEVELS[index].gym_id, disable_env_checker=True).unwrapped
    raw.reset(seed=0)  # this seed is known to reject samples
    assert "Sampling rejected" in capsys.readouterr().out
    BabyAIEnv().reset(index)
    assert "Sampling rejected" not in capsys.readouterr().out


# -------------------------------------------------------------------------------- expert
def test_expert_solves_test_items_within_20_turns():
    env, expert = TurnLimit(BabyAIEnv(), 20), EnvExpert()
    items = [0, 4, 5, 9, 16, 17, 24, 28, 31, 38]  # ten levels, up to 11 turns
    for item in items:
        env.reset(item)
        for _ in range(20):
            reply = expert.act(env)
            assert reply.startswith("Thought: ") and "\nAction: " in reply
            obs, reward, terminated, truncated, info = env.step(reply)
            assert not info["invalid_action"], reply
            if terminated or truncated:
                break
        assert info["success"], f"babyai_{item} ({info['level']}) not solved"


def test_expert_is_not_fooled_by_a_repeated_item():
    """The expert keeps state between turns; a reset of the same item must not reuse it."""
    env, expert = BabyAIEnv(), EnvExpert()
    replies = []
    for _ in range(2):
        env.reset(24)
        replies.append([])
        for _ in range(3):
            reply = expert.act(env)
            replies[-1].append(reply)
            if env.step(reply)[2]:
                break
    assert replies[0] == replies[1]


def test_observations_without_the_action_list_still_answer_check_available_actions():
    env = BabyAIEnv(list_actions=False)
    obs, _ = env.reset(0)
    assert "Available actions" not in obs and obs.startswith("Your goal: go to the red ball")
    obs, *_ , info = env.step("check available actions")
    assert 'Available actions: ["turn left"' in obs and not info["invalid_action"]
    obs, *_ = env.step("turn left")
    assert "Available actions" not in obs


def test_note_unchanged_marks_an_accepted_action_that_left_the_level_as_it_was():
    noting, plain = BabyAIEnv(note_unchanged=True), BabyAIEnv()
    for environment in (noting, plain):
        environment.reset(0)
    target = next(obj for obj in observe(noting.minigrid_env).objects if obj.color == "grey")
    moved = noting.step(f"go to {target.label}")[0]
    assert moved == plain.step(f"go to {target.label}")[0] and "changed nothing" not in moved
    again, *_, info = noting.step(f"go to {target.label}")  # already facing it: no step taken
    assert again == f"That action changed nothing. {moved}" and not info["invalid_action"]
    assert plain.step(f"go to {target.label}")[0] == moved  # the original repeats word for word
    assert noting.step("check available actions")[0] == moved  # a question, not an action
    assert "changed nothing" not in noting.step("turn left")[0]
    assert noting.step("pickup")[0].startswith("You cannot do that:")  # refused, not unchanged
    assert registry.spec("babyai").safe_kwargs["note_unchanged"].kind is bool


@pytest.mark.parametrize("item", [0, 5, 25, 31])
def test_a_color_permuted_observation_is_what_the_recolored_level_shows(item):
    """`permute_colors` renames the text as recoloring the level's objects would: the renderer's
    observation of the recolored level equals the renamed observation of the original."""
    import random

    from agentgym_rl.envs.babyai.augment import permute_colors

    env = BabyAIEnv()
    observation, _ = env.reset(item)
    rng = random.Random(item)
    [renamed] = permute_colors([{"role": "user", "content": observation}], random.Random(item))
    # The same permutation, applied to the level itself.
    from minigrid.core.constants import COLOR_NAMES

    shuffled = list(COLOR_NAMES)
    rng.shuffle(shuffled)
    mapping = dict(zip(COLOR_NAMES, shuffled))
    level = env.minigrid_env
    for obj in level.grid.grid:
        if obj is not None and obj.type != "wall":
            obj.color = mapping[obj.color]
    for color, new in mapping.items():
        level.mission = level.mission.replace(f" {color} ", f" {{{new}}} ")
    level.mission = level.mission.replace("{", "").replace("}", "")
    assert _unordered(renamed["content"]) == _unordered(describe(observe(level), True))
    assert renamed["content"] != observation or all(mapping[c] == c for c in COLOR_NAMES)


def _unordered(observation: str) -> tuple:
    """An observation with its lists as sets: objects at equal distance are listed by color name,
    so renaming colors may swap two of them."""
    goal, rest = observation.split("You can see: ", 1)
    seen, rest = rest.split(". You are", 1)
    state, actions = rest.split("Available actions: ")
    return goal, frozenset(seen.split("; ")), state, frozenset(json.loads(actions))


def test_permute_colors_renames_whole_words_only_and_alike_in_every_message():
    import random

    from agentgym_rl.envs.babyai.augment import permute_colors

    messages = [{"role": "user", "content": "Your goal: go to the red ball. You entered; a grey key 1."},
                {"role": "assistant", "content": "Action: go to red ball 1", "loss": True}]
    renamed = permute_colors(messages, random.Random(3))
    first, second = renamed[0]["content"], renamed[1]["content"]
    red = first.split("go to the ")[1].split(" ")[0]
    assert f"go to {red} ball 1" in second and "entered" in first and renamed[1]["loss"] is True
    assert red != "red" or "grey key" not in first  # random.Random(3) moves at least one of them
