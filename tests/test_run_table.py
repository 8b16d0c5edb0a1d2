"""`bench/run_table.py`: a run folder's steps and validations as RESULTS' tables, counted by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from conftest import bench_script


def load_module():
    return bench_script("run_table")


def write_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def episode(item: str, success: bool, group: int = 0, replies: tuple[str, ...] = (), **fields) -> dict:
    messages = [{"role": "user", "content": "goal"}]
    for reply in replies:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "next"}]
    return {"env_id": "babyai", "item_id": item, "category": "GoTo" if item != "babyai_2" else "Pickup",
            "group": group, "success": success, "reward": float(success), "messages": messages, **fields}


def one_step_run(tmp_path: Path, validations: dict[str, list[dict]]) -> Path:
    """A run folder of one step with one episode, and these files in its validation folder."""
    run = tmp_path / "run"
    write_lines(run / "metrics.jsonl", [{"step": 1}])
    (run / "config.yaml").write_text("{}\n")
    write_lines(run / "trajectories" / "step_000001.jsonl", [episode("babyai_0", True)])
    for name, episodes in validations.items():
        write_lines(run / "validation" / name, episodes)
    return run


def test_steps_and_validations_counted_by_hand(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("rollout: {example: babyai_91, example_turns: 1}\n")
    write_lines(run / "metrics.jsonl", [{"step": 1, "time/rollout_s": 10.4, "time/update_s": 5.0,
                                         "adv/rare_action_tokens": 3, "adv/discovery_tokens": 2},
                                        {"step": 1, "val/success": 1.0}])
    # Group 0's rewards differ, group 1's tie; 2 of 8 turns refused; kinds: go to 3, pickup 2, toggle 1.
    write_lines(run / "trajectories" / "step_000001.jsonl", [
        episode("babyai_0", True, 0, replies=("Action: go to grey ball 1", "go", "go", "pick"), turns=2,
                invalid_actions=1, action_verbs=["go to", "pickup"]),  # after the example's turn, 1 of 2 repeats
        episode("babyai_0", False, 0, turns=2, invalid_actions=0, action_verbs=["go to", "toggle"]),
        episode("babyai_1", False, 1, turns=2, invalid_actions=1, action_verbs=["go to"]),
        episode("babyai_1", False, 1, turns=2, invalid_actions=0, action_verbs=["pickup"]),
    ])
    # The worked example's one turn ("go to grey ball 1") is left out of the kinds written.
    example = "Action: go to grey ball 1"
    write_lines(run / "validation" / "step_000000.jsonl", [
        episode("babyai_0", True, replies=(example, "Action: go to red ball 1"), turns=1, invalid_actions=0),
        episode("babyai_1", False, replies=(example, "Action: dance", "I think", "I think"), turns=3,
                invalid_actions=2),
        episode("babyai_2", False, replies=(example, "Action: pick up"), turns=1, invalid_actions=1),
    ])
    write_lines(run / "validation" / "step_000001.jsonl", [
        episode("babyai_0", True, replies=(example, "Action: pickup red ball 1"), turns=1, invalid_actions=0),
        episode("babyai_1", True, replies=(example, "Action: go to red ball 1"), turns=1, invalid_actions=0),
        episode("babyai_2", True, replies=(example, "Action: pickup grey key 1"), turns=1, invalid_actions=0),
    ])
    assert load_module().main([str(run), "--kinds", "2"]) == 0
    out = capsys.readouterr().out
    assert "| sampled success | 25% |\n| groups whose rewards differ | 1 of 2 |" in out  # no greedy members
    assert "| groups whose rewards differ | 1 of 2 |\n| turns played (total so far) | 8 (8) |" in out
    assert "| refused actions | 25% |\n| replies repeating the last | 50% (1 of 2) |" in out
    assert "| accepted actions: go to / pickup | 3 / 2 |" in out
    assert "| tokens given the rare-action bonus | 3 |\n| tokens given the discovery bonus | 2 |" in out
    assert "| step (s): rollout + update | 10 + 5 |" in out
    assert ("| greedy validation | success | GoTo (2) | Pickup (1) | refused actions | mean turns | "
            "replies repeating the last | actions written |") in out
    assert ("| step_000000.jsonl | 33.3% (1) | 1 | 0 | 60% (3 of 5) | 1.7 | 50% (1 of 2) | "
            "(no Action: line) 2, go to 1, (not an action) 1, pickup 1 |") in out
    assert "| step_000001.jsonl | 100.0% (3) | 2 | 1 | 0% (0 of 3) | 1.0 | 0% (0 of 0) | pickup 2, go to 1 |" in out
    assert "after a note" not in out  # no observation holds the note
    assert "step_000001.jsonl against step_000000.jsonl: +66.7 points: 2 items gained, 0 lost" in out


def test_greedy_members_are_each_groups_first_episodes(tmp_path, capsys):
    """With `algo.greedy_samples: 1`, the first episode of each group is its greedy member: its
    success is shown apart and left out of the sampled one's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: {greedy_samples: 1}\n")
    write_lines(run / "metrics.jsonl", [{"step": 1}])
    write_lines(run / "trajectories" / "step_000001.jsonl", [
        episode("babyai_0", True, 0), episode("babyai_0", False, 0), episode("babyai_0", True, 0),
        episode("babyai_1", False, 1), episode("babyai_1", False, 1), episode("babyai_1", False, 1, action_verbs=["go to"]),
    ])
    assert load_module().main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| sampled success | 25% |\n| greedy members' success | 50% |" in out
    assert "| accepted actions: go to | 1 |" in out and "bonus" not in out  # no bonus in this run


def test_a_folder_without_a_run_is_one_line(tmp_path, capsys):
    assert load_module().main([str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_against_pairs_every_validation_with_another_runs_file(tmp_path, capsys):
    run = one_step_run(tmp_path, {"step_000000.jsonl": [episode("babyai_0", True), episode("babyai_1", True)]})
    kept = tmp_path / "kept_step0.jsonl.gz"
    with gzip.open(kept, "wt") as handle:
        handle.write(json.dumps(episode("babyai_0", False)) + "\n" + json.dumps(episode("babyai_1", True)) + "\n")
    assert load_module().main([str(run), "--against", str(kept)]) == 0
    out = capsys.readouterr().out
    assert out.index("| kept_step0.jsonl.gz | 50.0% (1) |") < out.index("| step_000000.jsonl | 100.0% (2) |")
    assert "step_000000.jsonl against kept_step0.jsonl.gz: +50.0 points: 1 items gained, 0 lost" in out
    other = tmp_path / "other" / "validation" / "step_000000.jsonl"  # another run's file of the same name
    write_lines(other, [episode("babyai_0", False), episode("babyai_1", False)])
    assert load_module().main([str(run), "--against", str(other)]) == 0
    out = capsys.readouterr().out
    assert "| other/step_000000.jsonl | 0.0% (0) |" in out
    assert "step_000000.jsonl against other/step_000000.jsonl: +100.0 points: 2 items gained, 0 lost" in out


def test_also_adds_an_evaluation_kept_outside_the_validation_folder(tmp_path, capsys):
    run = one_step_run(tmp_path, {"step_000000.jsonl": [episode("babyai_0", False), episode("babyai_1", False)]})
    later = run / "eval_step23.jsonl"  # as `agentgym-rl eval --trajectories` writes it
    write_lines(later, [episode("babyai_0", True), episode("babyai_1", False)])
    assert load_module().main([str(run), "--also", str(later)]) == 0
    out = capsys.readouterr().out
    assert out.index("| step_000000.jsonl | 0.0% (0) |") < out.index("| eval_step23.jsonl | 50.0% (1) |")
    assert "eval_step23.jsonl solved: babyai_0" in out
    assert "eval_step23.jsonl against step_000000.jsonl: +50.0 points: 1 items gained, 0 lost" in out


def test_replies_after_the_note_that_an_action_changed_nothing_are_counted_apart(tmp_path, capsys):
    """`env.kwargs.note_unchanged`: a reply counts when the observation before it opens with the
    note and a reply after the worked example came before it; it repeats when it is that reply,
    and names the same action when its Action line does (1 repeat, 2 same actions of 3)."""
    note = "That action changed nothing. You see a door."

    def noted(*turns: tuple[str, str]) -> dict:
        messages = [{"role": "user", "content": "goal"}]
        for reply, observation in turns:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
        return {**episode("babyai_0", False, turns=len(turns) - 1), "messages": messages}

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("rollout: {example: babyai_91, example_turns: 1}\n")
    write_lines(run / "metrics.jsonl", [{"step": 1}])
    episodes = [
        noted(("example", "obs"), ("Action: go to door", note), ("Action: go to door", note),
              ("Thought: again.\nAction: go to door", note), ("Action: toggle", "obs")),
        # The note after the example's turn has no reply of the episode before it; "x" repeats without a note.
        noted(("example", note), ("Action: x", "obs"), ("Action: x", "obs")),
    ]
    write_lines(run / "trajectories" / "step_000001.jsonl", episodes)
    write_lines(run / "validation" / "step_000000.jsonl", episodes)
    assert load_module().main([str(run)]) == 0
    out = capsys.readouterr().out
    assert ("| replies repeating the last | 50% (2 of 4) |\n"
            "| replies after a note repeating the last | 33% (1 of 3), the same action 67% |") in out
    assert ('step_000000.jsonl: replies after a note ("That action changed nothing.") repeating the last: '
            "33% (1 of 3), the same action 67%") in out


def test_solved_items_are_listed_short_and_a_recorded_list_is_paired(tmp_path, capsys):
    """Each validation's solved items in RESULTS' short form, and `--against-solved` pairing them
    with a list recorded for a run whose files are gone: 2 items gained (babyai_1, 10), 1 lost
    (babyai_3), babyai_2 solved by both: +1 of 4 items."""
    run = one_step_run(tmp_path, {"step_000014.jsonl": [episode("babyai_10", True), episode("babyai_2", True),
                                                         episode("babyai_1", True), episode("babyai_3", False)]})
    module = load_module()
    assert module.main([str(run), "--against-solved", "gigpo_s0=babyai_2, 3"]) == 0
    out = capsys.readouterr().out
    assert "step_000014.jsonl solved: babyai_1, 2, 10\n" in out  # by number, not as text ("10" < "2")
    assert "step_000014.jsonl against gigpo_s0: +25.0 points: 2 items gained, 1 lost" in out
    assert module.parse_solved("x=babyai_3,babyai_12, 4") == ("x", {"babyai_3", "babyai_12", "babyai_4"})
    assert module.parse_solved("x=babyai_1, 2, 10")[1] == {"babyai_1", "babyai_2", "babyai_10"}  # the short form read back


def test_a_recorded_list_that_does_not_fit_is_one_line(tmp_path, capsys):
    run = one_step_run(tmp_path, {"step_000000.jsonl": [episode("babyai_0", True)]})
    module = load_module()
    assert module.main([str(run), "--against-solved", "babyai_0"]) == 2
    assert "NAME=IDS" in capsys.readouterr().err
    assert module.main([str(run), "--against-solved", "old=3, babyai_0"]) == 2
    assert "before any whole id" in capsys.readouterr().err
    assert module.main([str(run), "--against-solved", "old=babyai_0, 7"]) == 2
    assert "babyai_7 not among step_000000.jsonl's items" in capsys.readouterr().err


def test_turns_played_add_up_over_the_steps(tmp_path, capsys):
    run = tmp_path / "run"
    write_lines(run / "metrics.jsonl", [{"step": 1}, {"step": 2}])
    (run / "config.yaml").write_text("env: {id: babyai}\n")
    write_lines(run / "trajectories" / "step_000001.jsonl", [episode("babyai_0", True, turns=2),
                                                            episode("babyai_0", False, turns=1_200)])
    # No "turns" field: the turn rewards count them.
    write_lines(run / "trajectories" / "step_000002.jsonl", [episode("babyai_0", True, turn_rewards=[0, 0, 1]),
                                                            episode("babyai_0", False, turns=4)])
    assert load_module().main([str(run)]) == 0
    assert "| turns played (total so far) | 1,202 (1,202) | 7 (1,209) |" in capsys.readouterr().out
