"""`bench/rollout_vs_trl.py`'s count of the work TRL's per-turn recomputation does against our
continued cache, by hand on one two-turn episode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import bench_script


def test_work_ratio_by_hand():
    module = bench_script("rollout_vs_trl")
    # replies at positions 3-4 and 7-9. Turn 1: both run the 3-token prompt and 2 replies
    # (5 columns; 3²/2 + 2·3 = 10.5 pairs). Turn 2: TRL runs the 7-token prompt and 3 replies
    # (10 columns; 7²/2 + 3·7 = 45.5), we run 2 new tokens and 3 replies against 5 kept
    # (5 columns; 2·(5 + 1) + 3·(5 + 2) = 33).
    episode = SimpleNamespace(loss_mask=[0, 0, 0, 1, 1, 0, 0, 1, 1, 1])
    columns, pairs = module.work_ratio([episode])
    assert columns == pytest.approx(15 / 10)
    assert pairs == pytest.approx(56 / 43.5)
