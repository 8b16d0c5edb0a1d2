"""Bad model output is feedback in every environment, never an exception: an empty reply,
several Action lines (the last one counts, everywhere), a 100 KB reply, NULs, and text that was
not valid UTF-8 (lone surrogates, which once killed SciWorld's JVM)."""

from __future__ import annotations

import pytest

from agentgym_rl.envs import make
from agentgym_rl.envs.parsing import MAX_ACTION_CHARS, extract_action

BAD = {
    "empty": "",
    "blank action line": "Thought: hmm\nAction:   ",
    "100 KB": "Action: " + "x" * 100_000,
    "NUL": "Action: turn\x00 around\x00",
    "lone surrogate": "Action: go to \ud800 ball",
    "invalid UTF-8 (surrogateescape)": "Action: \udcff\udcfe",
}


def test_extract_action_makes_text_safe_and_takes_the_last_action_line():
    assert extract_action("Thought: a\nAction: first\nAction: second") == "second"
    assert extract_action("Action: go\x00 on") == "go on"
    assert extract_action("Action: go to \ud800 ball") == "go to ? ball"
    assert len(extract_action("Action: " + "y" * 5000)) == MAX_ACTION_CHARS
    assert extract_action("Action:  ") is None and extract_action("") is None


@pytest.mark.parametrize("env_id", ["babyai", "textcraft", "sciworld"])
def test_bad_output_is_an_invalid_action_with_feedback(env_id):
    env = make(env_id)
    try:
        for name, reply in BAD.items():
            env.reset(3)
            observation, reward, terminated, truncated, info = env.step(reply)
            assert info["invalid_action"], name
            assert reward == 0 and not terminated, name
            assert isinstance(observation, str) and 0 < len(observation) < 20_000, name
        # Several Action lines: the last one is the action, in every environment.
        env.reset(3)
        first = {"babyai": env.available_actions()[0], "textcraft": "inventory", "sciworld": "look around"}[env_id]
        *_, info = env.step(f"Action: {first}\nAction: not an action at all")
        assert info["invalid_action"]
        env.reset(3)
        *_, info = env.step(f"Action: not an action at all\nAction: {first}")
        assert not info["invalid_action"]
    finally:
        env.close()
