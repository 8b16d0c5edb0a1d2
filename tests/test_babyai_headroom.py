"""`bench/babyai_headroom.py`: the BabyAI test items one listed action solves, read off the
environment, and the table it sets a validation file beside."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from conftest import bench_script


def load_module():
    return bench_script("babyai_headroom")


def test_items_solved_at_once_or_after_a_turn():
    rows = {row["item_id"]: row for row in load_module().headroom("test", 10)}
    # babyai_0: "go to the red ball" with the ball in view; picking it up also ends next to it.
    assert rows["babyai_0"]["at_once"] == ["go to red ball 1", "pickup red ball 1"]
    assert rows["babyai_3"]["at_once"] == ["pickup grey key 1"]  # "pick up the grey key"
    assert rows["babyai_0"]["in_view"] and rows["babyai_0"]["described"] == [("red", "ball")]
    # babyai_4: "open the door in front of you" with the door to the left: a turn first; any door's color.
    assert rows["babyai_4"] == {"item_id": "babyai_4", "category": "AOD", "at_once": [], "after_turn": True,
                                "in_view": False, "described": [(None, "door")]}
    # babyai_5: "put the green ball next to the green key", both in view: two objects described.
    assert rows["babyai_5"]["in_view"] and rows["babyai_5"]["described"] == [("green", "ball"), ("green", "key")]
    # babyai_9: "open the door" with no object in view: neither.
    assert rows["babyai_9"]["at_once"] == [] and not rows["babyai_9"]["after_turn"] and not rows["babyai_9"]["in_view"]


def test_table_counts_a_validation_file(tmp_path, capsys):
    validation = tmp_path / "step_000000.jsonl.gz"
    with gzip.open(validation, "wt") as out:
        for item_id, success in [("babyai_0", True), ("babyai_4", True), ("babyai_9", False)]:
            out.write(json.dumps({"item_id": item_id, "success": success}) + "\n")
    assert load_module().main(["--episodes", "10", str(validation)]) == 0
    table = capsys.readouterr().out
    # Of the first 10 items, 0-3 and 6 are solved at once (5), 4 and 7 after a turn (7 in all);
    # 4, 7 and 9 start with the goal's object out of view. The file holds no refused action.
    assert "| all | 10 | 5 | 7 | 3 | 2 (1 of them one-action, 1 out of view) |" in table
    assert "| AOD | 3 | 0 | 1 | 2 | 1 (0 of them one-action, 1 out of view) |" in table
    assert "| all | 0 |" in table


def test_refused_actions_are_sorted_by_the_reason_given(tmp_path, capsys):
    """babyai_0's goal is the red ball, babyai_4's any door. Named out of view: the red ball (twice:
    the second time only the refusal and the worked example, another item's, had named it) and a
    blue door are the goal's objects, a grey ball is not; of them only the grey ball was named so
    by an earlier observation; "jump" is no action; the accepted turn is not counted, nor an item
    outside the first 10 (babyai_50)."""
    def turns(goal, pairs):
        messages = [{"role": "system", "content": "Reply with an action."},
                    {"role": "user", "content": "Your goal: go to the red ball\nYou can see: a red ball 2."},
                    {"role": "assistant", "content": "Action: go to red ball 2", "loss": False},
                    {"role": "user", "content": f"Your goal: {goal}\nYou can see: a grey ball 1 in front of you."}]
        for reply, answer in pairs:
            messages += [{"role": "assistant", "content": f"Action: {reply}"},
                         {"role": "user", "content": f"{answer}Your goal: {goal}\nYou can see: a wall."}]
        return messages

    refused = "You cannot do that: "
    records = [
        {"item_id": "babyai_0", "success": False, "invalid_turns": [0, 1, 3, 4], "messages": turns(
            "go to the red ball", [("pickup red ball 2", f"{refused}there is no red ball 2 in view. "),
                                   ("pickup red ball 2", f"{refused}there is no red ball 2 in view. "),
                                   ("turn left", ""),
                                   ("go to grey ball 1", f"{refused}there is no grey ball 1 in view. "),
                                   ("jump", f"{refused}that is not a valid action. ")])},
        {"item_id": "babyai_4", "success": False, "invalid_turns": [0], "messages": turns(
            "open the door in front of you",
            [("go through blue door 1", f"{refused}there is no blue door 1 in view. ")])},
        {"item_id": "babyai_50", "success": False, "invalid_turns": [0], "messages": turns(
            "go to the red ball", [("jump", f"{refused}that is not a valid action. ")])},
    ]
    validation = tmp_path / "step_000001.jsonl"
    validation.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert load_module().main(["--episodes", "10", str(validation)]) == 0
    table = capsys.readouterr().out
    assert "| there is no X in view: the goal's object, a name no earlier view gave | 3 |" in table
    assert "| there is no X in view: another object, named as an earlier view named it | 1 |" in table
    assert "| that is not a valid action | 1 |" in table
    assert "| all | 5 |" in table


def test_missing_validation_file_is_one_line(tmp_path, capsys):
    assert load_module().main([str(tmp_path / "absent.jsonl")]) == 2
    assert "no such validation file" in capsys.readouterr().err


def test_columns_of_two_runs_are_told_apart_by_their_folders():
    labels = load_module().column_labels([Path("runs/a/validation/step_000014.jsonl"),
                                          Path("runs/b/validation/step_000014.jsonl"),
                                          Path("runs/b/validation/step_000000.jsonl")])
    assert labels == ["a/validation/step_000014.jsonl", "b/validation/step_000014.jsonl",
                      "b/validation/step_000000.jsonl"]


def test_failed_episodes_are_sorted_by_how_they_end():
    """Each failure's last 3 replies: one action refused (listed in the observation before it, in
    other quotes and case, or not listed), one action accepted (its last turn idle or not), or
    not one action; successes and items outside the set are not counted."""
    def episode(item_id, replies, success=False, invalid=(), idle=()):
        messages = [{"role": "system", "content": "Reply with an action."}]
        for reply in replies:
            messages += [{"role": "user", "content": 'Your goal: open the door\nYou can see: a wall.\n'
                                                     'Available actions: ["turn left", "toggle and go through red door 1"]'},
                         {"role": "assistant", "content": f"Action: {reply}\n\nYou can see"}]
        messages.append({"role": "user", "content": "You cannot do that: ..."})
        return {"item_id": item_id, "success": success, "messages": messages, "invalid_turns": list(invalid),
                "idle_turns": list(idle)}

    toggle, pickup = "toggle and go through red door 1", "pickup red key 1"
    records = [
        episode("a", ["turn left", toggle, toggle, f'"{toggle.upper()}"'], invalid=[1, 2, 3]),
        episode("b", [pickup] * 3, invalid=[0, 1, 2]),
        episode("c", ["go to red door 1"] * 4, idle=[1, 2, 3]),
        episode("d", ["turn left"] * 3),
        episode("e", [pickup, pickup, "turn left"], invalid=[0, 1]),
        episode("f", [pickup] * 2, invalid=[0, 1]),  # fewer replies than the window
        episode("g", [pickup] * 3, invalid=[0, 1, 2], success=True),
        episode("h", [pickup] * 3, invalid=[0, 1, 2]),  # outside the items
    ]
    module = load_module()
    endings = module.failure_endings(records, {"a", "b", "c", "d", "e", "f", "g"})
    assert [endings[ending] for ending in module.ENDINGS] == [1, 1, 1, 1, 2]
