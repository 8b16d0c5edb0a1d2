"""Extracting the action from a ReAct reply ("Thought: ...\\nAction: ...")."""

from __future__ import annotations

import re

_ACTION_LINE = re.compile(r"^\s*action\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


def extract_action(text: str) -> str | None:
    """Return the action of a ReAct reply, or the whole text when it has no `Action:` line.

    The last `Action:` line wins (a model that "corrects itself" means the later one).
    Returns None for an empty reply or an empty `Action:` line.
    """
    matches = _ACTION_LINE.findall(text)
    action = matches[-1] if matches else text.strip()
    action = action.strip().strip("`").strip().rstrip(".")
    return action or None


def drop_thought(text: str) -> str:
    """The reply from its last `Action:` line on ("Thought: x\nAction: y" -> "Action: y");
    a reply without one is returned unchanged."""
    starts = list(_ACTION_LINE.finditer(text))
    return text[starts[-1].start():].strip() if starts else text
