"""WebArena's action grammar: parsing a reply into one browser action.

The action is the last block in triple backticks (```click [12]```); a reply with no
backticks counts its last non-empty line. Parsing never raises: a reply that is not an action
gives a `ParseError` whose text tells the agent what to write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GRAMMAR = (
    "click [id] | type [id] [text] [1 to press Enter after, 0 not] | hover [id] | press [key, e.g. Enter or "
    "Control+a] | scroll [up|down] | new_tab | tab_focus [tab index] | close_tab | goto [url] | go_back | "
    "go_forward | stop [answer, or nothing for a task without one]"
)


@dataclass(frozen=True)
class Action:
    """One browser action. `element` is an id of the page text; `text` is what `type`
    writes, the key of `press`, the URL of `goto`, or the answer of `stop`."""

    kind: str
    element: int | None = None
    text: str = ""
    press_enter: bool = True
    direction: str = ""
    tab: int | None = None

    def __str__(self) -> str:
        if self.kind == "type":
            return f"type [{self.element}] [{self.text}] [{int(self.press_enter)}]"
        if self.element is not None:
            return f"{self.kind} [{self.element}]"
        argument = self.direction or (str(self.tab) if self.tab is not None else self.text)
        return f"{self.kind} [{argument}]" if self.kind in ("scroll", "tab_focus", "press", "goto", "stop") else self.kind


@dataclass(frozen=True)
class ParseError:
    message: str


_BLOCK = re.compile(r"```(?:[a-z]*\n)?(.*?)```", re.DOTALL)
_ELEMENT = re.compile(r"^(click|hover)\s*\[(\d+)\]$")
_TYPE = re.compile(r"^type\s*\[(\d+)\]\s*\[(.*?)\](?:\s*\[([01])\])?$", re.DOTALL)
_ARGUMENT = re.compile(r"^(press|scroll|tab_focus|goto|stop)\s*(?:\[(.*)\])?$", re.DOTALL)
_BARE = ("new_tab", "close_tab", "go_back", "go_forward")


def parse_action(reply: str) -> Action | ParseError:
    """The action of a model reply (see the module docstring)."""
    reply = reply.replace("\x00", "")
    blocks = _BLOCK.findall(reply)
    if blocks:
        text = blocks[-1].strip()
    else:
        lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else ""
        text = text.removeprefix("Action:").strip().strip("`").strip()
    if not text:
        return ParseError(f"Your reply held no action. Write one action in triple backticks: {GRAMMAR}")
    if text in _BARE:
        return Action(text)
    if match := _ELEMENT.match(text):
        return Action(match[1], element=int(match[2]))
    if match := _TYPE.match(text):
        return Action("type", element=int(match[1]), text=match[2], press_enter=match[3] != "0")
    if match := _ARGUMENT.match(text):
        kind, argument = match[1], (match[2] or "").strip()
        if kind == "stop":
            return Action("stop", text=argument)
        if not argument:
            return ParseError(f"'{kind}' needs an argument in brackets: {GRAMMAR}")
        if kind == "scroll":
            direction = argument.lower().removeprefix("direction=")
            if direction not in ("up", "down"):
                return ParseError(f"scroll takes [up] or [down], not [{argument}]")
            return Action("scroll", direction=direction)
        if kind == "tab_focus":
            if not argument.isdigit():
                return ParseError(f"tab_focus takes a tab index such as [0], not [{argument}]")
            return Action("tab_focus", tab=int(argument))
        return Action(kind, text=argument)
    return ParseError(f"'{text[:80]}' is not an action. Write one action in triple backticks: {GRAMMAR}")
