"""`--episodes N` of `eval` and `bench-agent` draws N items spread over the split's categories
(`envs.tasks.choose_items`), or its first N with `--items first`, which training's validation
keeps so that its figures stay comparable across runs; `eval`'s other defaults hold whatever
eval flag is given."""

from __future__ import annotations

import json

import pytest
from test_cli import run

from agentgym_rl.config import EvalConfig
from agentgym_rl.envs import registry
from agentgym_rl.envs.tasks import Task, choose_items


def test_items_are_taken_from_each_category_in_turn_and_kept_in_split_order():
    tasks = [Task("x", index, category) for index, category in enumerate("AAABCCA")]
    assert [t.index for t in choose_items(tasks, 4, "stratified")] == [0, 1, 3, 4]  # A B C, then A again
    assert [t.index for t in choose_items(tasks, 5, "stratified")] == [0, 1, 3, 4, 5]
    assert [t.index for t in choose_items(tasks, 2, "stratified")] == [0, 3]
    assert [t.index for t in choose_items(tasks, 4, "first")] == [0, 1, 2, 3]
    assert choose_items(tasks, 9, "stratified") == tasks
    with pytest.raises(ValueError, match="not 'random'"):
        choose_items(tasks, 2, "random")


def test_eval_spreads_its_items_and_validation_keeps_the_first(tmp_path):
    first_five = {task.category for task in registry.tasks("babyai", "test")[:5]}
    spread = {task.category for task in choose_items(registry.tasks("babyai", "test"), 5, "stratified")}
    assert len(spread) > len(first_five)  # otherwise this test shows nothing
    for flags, categories in (([], spread), (["--items", "first"], first_five)):
        out = tmp_path / "summary.json"
        result = run("eval", "--env", "babyai", "--policy", "random", "--episodes", "5", "--max-turns", "1",
                     "--json", str(out), *flags)
        assert result.returncode == 0, result.stderr
        assert set(json.loads(out.read_text())["by_category"]) == categories
        assert ("spread over the split's categories" in result.stdout) == (not flags)
    assert EvalConfig().items == "first"  # what training validates on
    bad = run("eval", "--env", "babyai", "--policy", "random", "--episodes", "5", "--items", "some")
    assert bad.returncode == 2 and "eval.items" in bad.stderr


def test_one_eval_flag_leaves_the_other_defaults_of_eval(tmp_path):
    """`--samples 2` alone used to bring training's eval defaults (90 items, temperature 0: two
    identical greedy episodes per item); it samples at temperature 1, where eval is greedy."""
    out = tmp_path / "summary.json"
    result = run("eval", "--env", "babyai", "--policy", "random", "--samples", "2", "--max-turns", "1",
                 "--json", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert summary["temperature"] == 1.0 and summary["items"] == "all"
    # The same from the config key, and a temperature given stays as given.
    for given, expected in ((["eval.samples=2"], 1.0), (["eval.samples=2", "eval.temperature=0"], 0.0)):
        result = run("eval", "--env", "babyai", "--policy", "random", "--max-turns", "1", "--episodes", "2",
                     "--json", str(out), *given)
        assert result.returncode == 0 and json.loads(out.read_text())["temperature"] == expected
    assert summary["episodes"] == len(registry.tasks("babyai", "test"))  # items, each played twice


def test_a_run_is_evaluated_on_the_items_its_validation_drew(tmp_path):
    from test_env_e2e import TINY_RUN

    train = run("train", "configs/babyai_grpo.yaml", *TINY_RUN, "env.kwargs={}",
                f"run.output_dir={tmp_path}", "run.name=r")
    assert train.returncode == 0, train.stderr[-2000:]
    out = tmp_path / "summary.json"
    result = run("eval", "--run", str(tmp_path / "r"), "--episodes", "5", "--max-turns", "1", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["items"] == "first"
    # The run validated on 90 items of the whole split; --category plays every item of the category.
    result = run("eval", "--run", str(tmp_path / "r"), "--category", "GoTo", "--max-turns", "1", "--json", str(out))
    assert result.returncode == 0, result.stderr
    goto = sum(task.category == "GoTo" for task in registry.tasks("babyai", "test"))
    assert json.loads(out.read_text())["episodes"] == goto


def test_eval_plays_only_the_categories_asked_for(tmp_path):
    tests = registry.tasks("babyai", "test")
    goto = sum(task.category == "GoTo" for task in tests)
    pickup = sum(task.category == "Pickup" for task in tests)
    assert 0 < goto < len(tests) and pickup > 0
    out = tmp_path / "summary.json"
    result = run("eval", "--env", "babyai", "--policy", "random", "--max-turns", "1", "--json", str(out),
                 "--category", "GoTo", "--category", "Pickup")
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert set(summary["by_category"]) == {"GoTo", "Pickup"} and summary["episodes"] == goto + pickup
    assert summary["categories"] == ["GoTo", "Pickup"] and "(GoTo, Pickup)" in result.stdout
    # --episodes chooses among the category's items; more than it has is refused with its count.
    result = run("eval", "--env", "babyai", "--policy", "random", "--max-turns", "1", "--json", str(out),
                 "--category", "GoTo", "--episodes", "2")
    assert result.returncode == 0 and set(json.loads(out.read_text())["by_category"]) == {"GoTo"}
    too_many = run("eval", "--env", "babyai", "--policy", "random", "--category", "GoTo", "--episodes", str(goto + 1))
    assert too_many.returncode != 0 and f"in GoTo has {goto} items" in too_many.stderr
    unknown = run("eval", "--env", "babyai", "--policy", "random", "eval.categories=[Goto]")
    assert unknown.returncode != 0 and "no category 'Goto'; it has " in unknown.stderr and "GoTo" in unknown.stderr
    assert "Traceback" not in unknown.stderr
