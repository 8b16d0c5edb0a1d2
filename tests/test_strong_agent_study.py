"""`bench/strong_agent.py`'s tables by hand: an arm against the first arm paired over items and
seeds, and success per category with Avg@k / Pass@k; a finished run gains only what it lacks."""

from __future__ import annotations

import json

import pytest
from conftest import bench_script


@pytest.fixture(scope="module")
def study():
    return bench_script("strong_agent")


def run(seed, warmup, final, wall_min=10.0, by_category=None):
    items = "abcd"
    report = {"name": f"x_s{seed}", "seed": seed, "wall_s": 60 * wall_min, "peak_gb": 1.0,
              "warmup_items": dict(zip(items, map(float, warmup))), "final_items": dict(zip(items, map(float, final))),
              "categories": {"a": "X", "b": "X", "c": "Y", "d": "Y"}}
    report["warmup_success"] = sum(warmup) / 4
    report["final_success"] = sum(final) / 4
    if by_category:
        report["avg_at_4_by_category"], report["pass_at_4_by_category"] = by_category
    return report


REPORTS = {
    "recipe": [run(0, [1, 0, 0, 1], [1, 1, 0, 1], 20, ({"X": 0.5, "Y": 0.25}, {"X": 1.0, "Y": 0.5})),
               run(1, [1, 1, 0, 0], [1, 1, 1, 0], 30, ({"X": 1.0, "Y": 0.0}, {"X": 1.0, "Y": 0.0}))],
    "imitation": [run(0, [1, 0, 0, 1], [1, 0, 0, 1], 22), run(1, [1, 1, 0, 0], [1, 1, 0, 0], 26)],
}


def test_versus_table_pairs_each_seed_and_the_mean(study):
    lines = study.versus_table(REPORTS).splitlines()
    # seed 0: recipe - imitation per item = [0, 1, 0, 0]: +25, 1 gained, SE sqrt(0.25 / 4) = 25
    assert lines[2] == "| imitation | 0 | 50.0% | 75.0% | +25.0 (1 / 0, 25.0) | 22.0, 20.0 min |"
    # item means over seeds: imitation [1, .5, 0, .5], recipe [1, 1, .5, .5]: differences
    # [0, .5, .5, 0], mean .25, variance 1/12, SE sqrt(1/48) = 14.4
    assert lines[4] == "| **imitation, mean** | 2 | 50.0% | 75.0% | **+25.0** (SE 14.4) | 24.0, 25.0 min |"
    assert study.versus_table({"recipe": REPORTS["recipe"]}) == ""
    # Runs are paired by seed, not by their order in the lists.
    shuffled = {"recipe": REPORTS["recipe"], "imitation": REPORTS["imitation"][::-1]}
    assert sorted(study.versus_table(shuffled).splitlines()) == sorted(lines)


def test_category_table_means_over_seeds(study):
    lines = study.category_table({"recipe": REPORTS["recipe"]}, pass_k=4).splitlines()
    # X = items a, b: after warm-up 1, 0 | 1, 1 -> 3 of 4; final all -> 100%; Avg@4 (0.5 + 1) / 2
    assert lines[2] == "| recipe | X | 2 | 75.0% | 100.0% | 75.0% / 100.0% |"
    assert lines[3] == "| recipe | Y | 2 | 25.0% | 50.0% | 12.5% / 25.0% |"
    assert study.category_table({"imitation": REPORTS["imitation"]}, pass_k=0).splitlines()[2] == \
        "| imitation | X | 2 | 75.0% | 75.0% |"


def test_a_finished_run_gets_only_the_evaluations_it_lacks(study, tmp_path):
    run_dir = tmp_path / "recipe_s0"
    (run_dir / "validation").mkdir(parents=True)
    (run_dir / "validation" / "step_000000.jsonl").write_text(
        "\n".join(json.dumps({"item_id": i, "category": c, "success": True}) for i, c in (("a", "X"), ("b", "Y"))))
    (tmp_path / "recipe_s0_pass4.json").write_text(json.dumps(
        {"success": 0.5, "pass_at_k": 0.75, "by_category": {"X": 0.5}, "pass_at_k_by_category": {"X": 0.75}}))
    report = study._complete({"final_listed": 0.7}, run_dir, tmp_path, pass_k=4, listed=True)
    assert report == {"final_listed": 0.7, "categories": {"a": "X", "b": "Y"}, "avg_at_4": 0.5, "pass_at_4": 0.75,
                      "avg_at_4_by_category": {"X": 0.5}, "pass_at_4_by_category": {"X": 0.75}}


def test_arms_share_the_warm_up_of_the_arm_named_and_versus_picks_the_baseline(study, tmp_path):
    spec = {"warmup_from": "grpo", "arms": {"imitation": ["warmup.epochs=5"], "grpo": [],
                                            "gigpo": ["model.path={warmup}", "algo.name=gigpo"]}}
    runs = study.plan(spec, [0, 1], tmp_path, only=["gigpo"], extra=["x=1"])
    # The shared arm runs first for every seed even when not asked for: the others start from it.
    assert [(arm, seed) for arm, seed, _ in runs] == [("grpo", 0), ("grpo", 1), ("gigpo", 0), ("gigpo", 1)]
    assert runs[0][2] == ["x=1"]
    assert runs[3][2] == [f"model.path={tmp_path / 'grpo_s1' / 'warmup_model'}", "algo.name=gigpo", "x=1"]
    with pytest.raises(SystemExit, match="warmup_from"):
        study.plan({**spec, "warmup_from": "ppo"}, [0], tmp_path)
    # The versus table sets every arm against the one named: imitation − recipe, the sign flipped.
    flipped = study.versus_table(REPORTS, versus="imitation")
    assert "| recipe | 0 | 75.0% | 50.0% | -25.0 (0 / 1, 25.0) |" in flipped
