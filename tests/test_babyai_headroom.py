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
    # babyai_4: "open the door in front of you" with the door to the left: a turn first.
    assert rows["babyai_4"] == {"item_id": "babyai_4", "category": "AOD", "at_once": [], "after_turn": True}
    # babyai_9: "open the door" with no object in view: neither.
    assert rows["babyai_9"]["at_once"] == [] and not rows["babyai_9"]["after_turn"]


def test_table_counts_a_validation_file(tmp_path, capsys):
    validation = tmp_path / "step_000000.jsonl.gz"
    with gzip.open(validation, "wt") as out:
        for item_id, success in [("babyai_0", True), ("babyai_4", True), ("babyai_9", False)]:
            out.write(json.dumps({"item_id": item_id, "success": success}) + "\n")
    assert load_module().main(["--episodes", "10", str(validation)]) == 0
    table = capsys.readouterr().out
    # Of the first 10 items, 0-3 and 6 are solved at once (5), 4 and 7 after a turn (7 in all).
    assert "| all | 10 | 5 | 7 | 2 (1 of them one-action) |" in table
    assert "| AOD | 3 | 0 | 1 | 1 (0 of them one-action) |" in table


def test_missing_validation_file_is_one_line(tmp_path, capsys):
    assert load_module().main([str(tmp_path / "absent.jsonl")]) == 2
    assert "no such validation file" in capsys.readouterr().err


def test_columns_of_two_runs_are_told_apart_by_their_folders():
    labels = load_module().column_labels([Path("runs/a/validation/step_000014.jsonl"),
                                          Path("runs/b/validation/step_000014.jsonl"),
                                          Path("runs/b/validation/step_000000.jsonl")])
    assert labels == ["a/validation/step_000014.jsonl", "b/validation/step_000014.jsonl",
                      "b/validation/step_000000.jsonl"]
