"""Horizon schedules for ScalingInter-RL."""

import pytest

from agentgym_rl.algos import SCHEDULE, HorizonSchedule, from_config


@pytest.fixture
def paper():
    return HorizonSchedule("stepwise", (6, 13, 20), every=100)


@pytest.mark.parametrize(
    "step, horizon, stage",
    [(0, 6, 0), (99, 6, 0), (100, 13, 1), (199, 13, 1), (200, 20, 2), (299, 20, 2), (300, 20, 2), (10_000, 20, 2)],
)
def test_stepwise_boundaries(paper, step, horizon, stage):
    # stage = min(step // 100, 2); the last horizon (20) is held forever.
    assert paper.horizon(step) == horizon
    assert paper.stage(step) == stage


def test_resume_is_stateless(paper):
    # A fresh object (as after a restart) answers the same for the resumed step.
    resumed = from_config("stepwise", [6, 13, 20], 100)
    assert resumed == paper and hash(resumed) == hash(paper)
    assert [resumed.horizon(s) for s in (150, 250)] == [13, 20]


def test_fixed():
    s = from_config("fixed", 15)
    assert s == HorizonSchedule("fixed", (15,), every=1)
    assert {s.horizon(t) for t in (0, 1, 99, 10_000)} == {15}
    assert s.stage(10_000) == 0 and s.max_horizon == 15


def test_every_one_and_single_stepwise():
    s = HorizonSchedule("stepwise", (2, 2, 5), every=1)
    assert [s.horizon(t) for t in range(5)] == [2, 2, 5, 5, 5]  # plateaus allowed
    assert HorizonSchedule("stepwise", (8,), every=10).horizon(1000) == 8


def test_arithmetic_matches_paper_formula():
    # h_{k+1} = h_k + δ: 6, 6+7, 6+14.
    assert HorizonSchedule.arithmetic(6, 7, 3, 100) == HorizonSchedule("stepwise", (6, 13, 20), 100)


def test_registered_kinds():
    assert sorted(SCHEDULE) == ["fixed", "stepwise"]
    assert SCHEDULE["stepwise"]([1, 2], 3) == HorizonSchedule("stepwise", (1, 2), 3)


@pytest.mark.parametrize(
    "kind, horizons, every, message",
    [
        ("stepwise", (), 100, "at least one horizon"),
        ("stepwise", (6, 0, 20), 100, "positive"),
        ("stepwise", (-3,), 100, "positive"),
        ("stepwise", (6, 20, 13), 100, "non-decreasing"),
        ("stepwise", (6, 13), 0, "every"),
        ("stepwise", (6, 13), -5, "every"),
        ("fixed", (6, 13), 1, "exactly one"),
        ("linear", (6,), 1, "unknown horizon schedule kind"),
        ("stepwise", (6.5, 13), 100, "integers"),
        ("stepwise", (True,), 100, "integers"),
    ],
)
def test_invalid_configs_raise(kind, horizons, every, message):
    with pytest.raises(ValueError, match=message):
        HorizonSchedule(kind, horizons, every)
    with pytest.raises(ValueError, match=message):
        from_config(kind, horizons, every)


def test_negative_step_raises(paper):
    with pytest.raises(ValueError, match="step"):
        paper.horizon(-1)
