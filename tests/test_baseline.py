"""A step-0 validation taken from a file (`train.baseline`): which files a run accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym_rl.config import RLConfig, load_config, to_dict
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.trajectory import Trajectory
from agentgym_rl.train.baseline import check_baseline, check_file, donor_differences, donor_settings, settings_path


def episode(item: str, ids: list[int], mask: list[int]) -> Trajectory:
    return Trajectory(env_id="babyai", item_id=item, category="GoTo", input_ids=ids, loss_mask=mask)


def test_the_first_reply_ends_where_the_first_generated_run_of_tokens_ends():
    assert episode("a", [5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 0, 1]).replies()[0][1] == 4
    assert episode("a", [5, 6, 7], [0, 1, 1]).replies()[0][1] == 3  # the reply runs to the end
    assert episode("a", [5, 6], [0, 0]).replies() == []


# One turn replayed per item: prompt 1 2, reply 3 4 (and for "b": prompt 1 5, reply 6).
REPLAYED = [episode("a", [1, 2, 3, 4], [0, 0, 1, 1]), episode("b", [1, 5, 6, 7], [0, 0, 1, 0])]


def test_a_file_with_the_same_first_replies_is_taken_whatever_comes_after():
    saved = [episode("b", [1, 5, 6, 7, 40, 41], [0, 0, 1, 0, 1, 1]), episode("a", [1, 2, 3, 4, 9, 9], [0, 0, 1, 1, 0, 1])]
    check_baseline(saved, REPLAYED, samples=1, source="f.jsonl")
    check_baseline(saved + saved, REPLAYED, samples=2, source="f.jsonl")


@pytest.mark.parametrize("a_saved,reason", [
    (episode("a", [1, 2, 3, 8, 9], [0, 0, 1, 1, 0]), "the first turn of 1 of 2 items differs"),  # another token
    (episode("a", [1, 2, 3, 4], [0, 0, 1, 0]), "the first turn of 1 of 2 items differs"),  # shorter reply
    (episode("a", [1, 2, 3, 4, 5], [0, 0, 1, 1, 1]), "the first turn of 1 of 2 items differs"),  # longer reply
    (episode("a", [7, 2, 3, 4], [0, 0, 1, 1]), "the first turn of 1 of 2 items differs"),  # another prompt
    (episode("c", [1, 2, 3, 4], [0, 0, 1, 1]), "missing babyai/a; not validated here babyai/c"),
])
def test_a_file_of_other_replies_or_other_items_is_refused(a_saved, reason):
    with pytest.raises(UserError, match=reason):
        check_baseline([a_saved, REPLAYED[1]], REPLAYED, samples=1, source="f.jsonl")


def test_a_file_with_fewer_samples_than_the_validation_plays_is_refused():
    with pytest.raises(UserError, match="2 wanted of each of 2 items"):
        check_baseline(REPLAYED, REPLAYED, samples=2, source="f.jsonl")


def test_replies_are_the_runs_of_generated_tokens():
    assert episode("a", list(range(9)), [0, 1, 1, 0, 0, 1, 0, 1, 1]).replies() == [(1, 3), (5, 6), (7, 9)]
    assert episode("a", [1, 2], [0, 0]).replies() == []


def test_a_file_is_refused_before_any_replay_when_its_shape_cannot_be_this_runs_step_0():
    saved = [Trajectory("babyai", item, "GoTo", input_ids=[1, 2, 3, 4, 5], loss_mask=[0, 1, 1, 0, 1],
                        turn_rewards=[0.0, 1.0]) for item in ("a", "b")]
    check_file(saved, episodes=2, max_turns=2, max_new_tokens=2, source="f.jsonl")
    with pytest.raises(UserError, match="holds 2 episodes; this run validates 3"):
        check_file(saved, episodes=3, max_turns=2, max_new_tokens=2, source="f.jsonl")
    with pytest.raises(UserError, match="episodes of 2 turns; this run validates 1"):
        check_file(saved, episodes=2, max_turns=1, max_new_tokens=2, source="f.jsonl")
    with pytest.raises(UserError, match="replies of 2 tokens; this run's are at most 1"):
        check_file(saved, episodes=2, max_turns=2, max_new_tokens=1, source="f.jsonl")


def test_the_settings_file_lies_beside_the_validation_file():
    assert settings_path("bench/baselines/x_step0.jsonl.gz") == Path("bench/baselines/x_step0.settings.json")
    assert settings_path("/tmp/x.jsonl") == Path("/tmp/x.settings.json")


# Each kept step-0 file and the recipe whose step 0 it stands for (bench/baselines/README.md).
KEPT = {"smollm2_babyai_grpo_free_step0": "smollm2_babyai_grpo_free.yaml",
        "smollm2_babyai_grpo_free3_step0": "smollm2_babyai_grpo_free.yaml",
        "smollm2_babyai_grpo_step0": "smollm2_babyai_grpo.yaml",
        "smollm2_textcraft_grpo_step0": "smollm2_textcraft_grpo.yaml"}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_each_kept_baseline_carries_the_settings_of_the_recipe_it_serves(name):
    """A recipe whose turn limit, context or env options changed no longer plays its kept step 0:
    this fails until the file is played again (or the recipe's comment stops pointing at it)."""
    root = Path(__file__).resolve().parent.parent
    kept = root / "bench" / "baselines" / f"{name}.jsonl.gz"
    assert {p.name for p in kept.parent.glob("*.jsonl.gz")} == {f"{n}.jsonl.gz" for n in KEPT}
    donor = donor_settings(kept)
    assert donor is not None, f"{settings_path(kept).name} is missing"
    recipe = to_dict(load_config(RLConfig, root / "configs" / KEPT[name]))
    assert donor_differences(donor, recipe) == []
    assert donor_differences(donor, {**recipe, "eval": {**recipe["eval"], "max_turns": 7}}) == [
        f"eval.max_turns ({donor['eval']['max_turns']} -> 7)"]


def test_a_settings_file_that_is_no_mapping_of_sections_is_refused_by_name(tmp_path):
    kept = tmp_path / "x_step0.jsonl.gz"
    assert donor_settings(kept) is None  # no settings beside it: taken on trust, and logged (tests/test_train_e2e.py)
    settings_path(kept).write_text('{"env": ["babyai"]}')
    with pytest.raises(UserError, match=r"x_step0\.settings\.json.*is not a mapping of sections"):
        donor_settings(kept)
    settings_path(kept).write_text("{not json")
    with pytest.raises(UserError, match=r"cannot read .*x_step0\.settings\.json"):
        donor_settings(kept)


def test_a_donor_from_before_stop_strings_was_played_without_them():
    root = Path(__file__).resolve().parent.parent
    recipe = to_dict(load_config(RLConfig, root / "configs" / "smollm2_babyai_grpo.yaml"))
    older = {section: dict(values) for section, values in recipe.items() if isinstance(values, dict)}
    del older["rollout"]["stop_strings"]
    assert donor_differences(older, recipe) == []
    stopping = {**recipe, "rollout": {**recipe["rollout"], "stop_strings": ["\n"]}}
    assert donor_differences(older, stopping) == ["rollout.stop_strings ([] -> ['\\n'])"]
    assert donor_differences(recipe, stopping) == ["rollout.stop_strings ([] -> ['\\n'])"]
