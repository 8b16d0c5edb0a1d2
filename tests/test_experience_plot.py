"""`bench/experience_plot.py`: greedy success against the turns a run's training played, by hand."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import bench_script


def write_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_run(folder: Path, turns_by_step: dict[int, list[int]], solved_by_step: dict[int, int]) -> Path:
    """A run whose step N played episodes of the given turns, validated on 4 items at the given steps."""
    write_lines(folder / "metrics.jsonl", [{"step": s} for s in turns_by_step])
    for step, turns in turns_by_step.items():
        write_lines(folder / "trajectories" / f"step_{step:06d}.jsonl", [{"turns": t} for t in turns])
    for step, solved in solved_by_step.items():
        write_lines(folder / "validation" / f"step_{step:06d}.jsonl",
                    [{"item_id": f"babyai_{i}", "success": i < solved} for i in range(4)])
    return folder


def test_points_sum_the_turns_played_through_each_validated_step(tmp_path, capsys):
    # Step 1 plays 2 + 3 turns, step 2 4 + 4 (one episode counted from its turn rewards), step 3 1.
    run = make_run(tmp_path / "a", {1: [2, 3], 2: [4], 3: [1]}, {0: 1, 2: 2})
    write_lines(run / "trajectories" / "step_000002.jsonl", [{"turns": 4}, {"turn_rewards": [0, 0, 0, 1]}])
    write_lines(run / "eval_step3.jsonl", [{"success": True}] * 3 + [{"success": False}])
    module = bench_script("experience_plot")
    out_png = tmp_path / "plot.png"
    assert module.main([str(run), "--eval", f"{run / 'eval_step3.jsonl'}@3", "--label", "a=seed 0",
                        "--out", str(out_png)]) == 0
    out = capsys.readouterr().out
    assert "| seed 0 | 0 | 0 | 25.0% |\n| seed 0 | 2 | 13 | 50.0% |\n| seed 0 | 3 | 14 | 75.0% |" in out
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mistakes_are_one_line(tmp_path, capsys):
    module = bench_script("experience_plot")
    run = make_run(tmp_path / "a", {1: [2]}, {1: 1})
    other = make_run(tmp_path / "b", {1: [2]}, {1: 1})
    assert module.main([str(tmp_path / "nothing")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert module.main([str(run), "--eval", str(run / "x.jsonl")]) == 2
    assert "expected FILE@STEP" in capsys.readouterr().err
    assert module.main([str(run), "--eval", f"{other / 'validation' / 'step_000001.jsonl'}@1"]) == 2
    assert "not one of the runs given" in capsys.readouterr().err
    assert module.main([str(run), "--label", "a"]) == 2
    assert "expected RUN=TEXT" in capsys.readouterr().err
    empty = make_run(tmp_path / "c", {1: [2]}, {})
    assert module.main([str(empty)]) == 2
    assert "has no validation" in capsys.readouterr().err


def test_a_validated_step_without_its_trajectories_is_warned(tmp_path, capsys):
    run = make_run(tmp_path / "a", {2: [5]}, {2: 4})
    assert bench_script("experience_plot").main([str(run)]) == 0
    captured = capsys.readouterr()
    assert "| a | 2 | 5 | 100.0% |" in captured.out
    assert "no trajectories for steps [1]" in captured.err
