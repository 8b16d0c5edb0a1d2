"""`bench/rollout_vs_trl.py`'s count of the work TRL's per-turn recomputation does against our
continued cache, by hand on one two-turn episode."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_work_ratio_by_hand():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("rollout_vs_trl", BENCH / "rollout_vs_trl.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    # replies at positions 3-4 and 7-9. Turn 1: both run the 3-token prompt and 2 replies
    # (5 columns; 3²/2 + 2·3 = 10.5 pairs). Turn 2: TRL runs the 7-token prompt and 3 replies
    # (10 columns; 7²/2 + 3·7 = 45.5), we run 2 new tokens and 3 replies against 5 kept
    # (5 columns; 2·(5 + 1) + 3·(5 + 2) = 33).
    episode = SimpleNamespace(loss_mask=[0, 0, 0, 1, 1, 0, 0, 1, 1, 1])
    columns, pairs = module.work_ratio([episode])
    assert columns == pytest.approx(15 / 10)
    assert pairs == pytest.approx(56 / 43.5)
