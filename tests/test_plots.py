"""The training plot's smoothing."""

import pytest

from agentgym_rl.eval.plots import smoothing_window, trailing_mean


def test_trailing_mean_by_hand():
    assert trailing_mean([1.0, 0.0, 1.0, 1.0], 2) == [1.0, 0.5, 0.5, 1.0]
    assert trailing_mean([0.2, 0.4, 0.9], 3) == pytest.approx([0.2, 0.3, 0.5])
    assert trailing_mean([0.3, 0.7], 1) == [0.3, 0.7]
    assert trailing_mean([], 4) == []
    with pytest.raises(ValueError, match="window"):
        trailing_mean([1.0], 0)


def test_smoothing_window_is_a_tenth_of_the_run_within_1_and_20():
    assert [smoothing_window(n) for n in (0, 9, 44, 120, 1000)] == [1, 1, 4, 12, 20]
