"""Avg@n / Pass@k with hand-computed values."""

from __future__ import annotations

import pytest

from agentgym_rl.eval.metrics import pass_at_k, summarize
from agentgym_rl.rollout.trajectory import Trajectory


def test_pass_at_k_hand_values():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=1: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4 (= c/n)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(3, 0, 3) == 0.0
    assert pass_at_k(3, 2, 2) == 1.0  # n - c = 1 < k
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def _t(item, category, success, reward, turns=2):
    return Trajectory(env_id="e", item_id=item, category=category, success=success,
                      turn_rewards=[0.0] * (turns - 1) + [reward])


def test_summarize_avg_at_n_pass_at_k_and_categories():
    trajectories = [
        _t("e_0", "A", True, 1.0), _t("e_0", "A", False, 0.0),   # item 0: 1 of 2
        _t("e_1", "A", False, 0.0), _t("e_1", "A", False, 0.0),  # item 1: 0 of 2
        _t("e_2", "B", True, 0.5), _t("e_2", "B", True, 0.5),    # item 2: 2 of 2
    ]
    s = summarize(trajectories)
    assert s.episodes == 3 and s.samples == 2 and s.k == 2
    assert s.success == pytest.approx(3 / 6)
    assert s.pass_at_k == pytest.approx((1 + 0 + 1) / 3)
    assert s.avg_reward == pytest.approx(2.0 / 6)
    assert s.by_category == {"A": pytest.approx(1 / 4), "B": 1.0}
    assert s.pass_at_k_by_category == {"A": pytest.approx(0.5), "B": 1.0}
    assert summarize(trajectories, k=1).pass_at_k == pytest.approx(0.5)


def test_summarize_counts_idle_turns_per_turn():
    from agentgym_rl.rollout.trajectory import Trajectory

    three = Trajectory("e", "e_0", "A", turn_rewards=[0.0, 0.0, 1.0], idle_turns=[0, 1])
    one = Trajectory("e", "e_1", "A", turn_rewards=[0.0])
    assert summarize([three, one]).idle_turn_rate == pytest.approx(2 / 4)
    # `eval`'s table names them when there are any
    from agentgym_rl.eval.evaluate import format_table

    assert "invalid actions 0.0%, idle turns 50.0%, errors 0" in format_table(summarize([three, one]), "e test")
    assert "invalid actions 0.0%, errors 0" in format_table(summarize([one]), "e test")


def test_paired_difference_counts_gains_and_losses():
    from agentgym_rl.eval.metrics import change_sentence, paired_difference

    before = {"a": False, "b": True, "c": False, "d": True}
    after = {"a": True, "b": True, "c": True, "d": False}
    mean, se, gained, lost = paired_difference(before, after)
    # diffs 1, 0, 1, -1: mean 0.25, sample variance ((.75²)*2 + .25² + 1.25²)/3 = 2.75/3
    assert mean == pytest.approx(0.25) and (gained, lost) == (2, 1)
    assert se == pytest.approx((2.75 / 3 / 4) ** 0.5)
    assert change_sentence(before, after) == ("+25.0 points: 2 items gained, 1 lost (paired standard error "
                                              f"{100 * (2.75 / 3 / 4) ** 0.5:.1f} points over 4 items)")
    # One item gives no spread, so no standard error; unpaired items and no items are refused.
    mean, se, gained, lost = paired_difference({"a": 0.0}, {"a": 1.0})
    assert (mean, gained, lost) == (1.0, 1, 0) and se != se  # NaN
    assert change_sentence({"a": 0.0}, {"a": 1.0}) == "+100.0 points: 1 items gained, 0 lost (one item: no standard error)"
    with pytest.raises(ValueError, match=r"1 are in one only: \['e'\]"):
        paired_difference(before, {**after, "e": True})
    with pytest.raises(ValueError, match="no items"):
        paired_difference({}, {})
