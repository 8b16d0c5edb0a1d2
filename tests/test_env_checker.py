"""`check_env` finds a broken contract even where a short episode would hide it."""

from __future__ import annotations

import pytest

from agentgym_rl.envs.base import EnvStateError, TextEnv
from agentgym_rl.envs.checker import check_env


class OneActionWins(TextEnv):
    """Any action ends the episode at once, a nonsense one too, and none is flagged invalid
    (the broken rule), so a check that plays the listed action first never reaches it."""

    env_id = "one_action_wins"

    def __init__(self, flags_nonsense: bool):
        self.flags_nonsense, self.running = flags_nonsense, False

    def reset(self, item_id=None, seed=None):
        self.running = True
        return "Say anything.", {"item_id": f"{self.env_id}_{item_id or 0}"}

    def step(self, action):
        if not self.running:
            raise EnvStateError("reset first")
        nonsense = action.startswith("!!")
        self.running = nonsense  # a real action wins at once; nonsense is answered and goes on
        invalid = nonsense and self.flags_nonsense
        return "Done." if not nonsense else "What?", float(not nonsense), not nonsense, False, {
            "item_id": f"{self.env_id}_0", "success": not nonsense, "invalid_action": invalid}

    def available_actions(self):
        return ["win"]


def test_a_nonsense_action_is_checked_even_when_the_listed_action_wins_at_once():
    check_env(OneActionWins(flags_nonsense=True))
    with pytest.raises(AssertionError, match="invalid_action"):
        check_env(OneActionWins(flags_nonsense=False))
