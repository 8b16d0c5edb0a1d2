"""The constructor arguments a request may set: what the viewer's playground lets a page choose.

Many constructor arguments name an executable (the web env's `chromium`), a file or folder
(`task_file`, `corpus`, `data_root`, a model folder), a URL (`retriever_url`, `judge_url`), or a
size whose cost has no bound (`world_size`, cached per value). Those come only from whoever
starts the process: a config, `--env-arg`. What a request may set is listed per environment in
`EnvSpec.safe_kwargs`, each argument with its type and bounds; every other argument is refused,
so a parameter added to a constructor later stays out of a request's reach until it is listed
(`registry.checked_kwargs` applies them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_TEXT = 200
"""Longest string a request may give for a listed argument."""


class NotSettable(ValueError):
    """An argument that a request may not set at all (as opposed to a bad value of one it may)."""


@dataclass(frozen=True)
class SafeArg:
    """One argument a request may set, and what it may be.

    Attributes:
        kind: bool, int, float or str.
        low, high: the bounds of a number, both included.
        choices: the values a str may take; with `separator`, each of its parts.
        separator: a str is several choices joined by it (SciWorld's "openDoors,teleportAction").
    """

    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    separator: str | None = None

    def check(self, name: str, value: Any) -> Any:
        """`value` if it is allowed, else a ValueError naming `name` and what is allowed."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            return value
        if self.kind in (int, float):
            allowed = (int,) if self.kind is int else (int, float)
            if isinstance(value, bool) or not isinstance(value, allowed) or not math.isfinite(value):
                raise ValueError(f"{name} must be {'an integer' if self.kind is int else 'a number'}, got {value!r}")
            if not self.low <= value <= self.high:
                raise ValueError(f"{name} must be in [{self.low}, {self.high}], got {value!r}")
            return value
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ValueError(f"{name} must be a string of at most {MAX_TEXT} characters")
        parts = value.split(self.separator) if self.separator else [value]
        wrong = [part for part in parts if part not in self.choices and not (self.separator and part == "")]
        if wrong:
            raise ValueError(f"{name} must be {'made of' if self.separator else 'one of'} "
                             f"{', '.join(self.choices)}; got {wrong[0][:40]!r}")
        return value


@dataclass(frozen=True)
class SafeMembers:
    """A mix's `members` as a request may give them: at most `max_members`, each an environment
    id other than the mix, a bounded weight and turn limit, and `kwargs`, a mapping that
    `registry.checked_kwargs` then checks against that member's own safe arguments."""

    max_members: int = 8

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, list) or not 0 < len(value) <= self.max_members:
            raise ValueError(f"{name} must be a list of 1 to {self.max_members} members")
        checked = []
        for entry in value:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise ValueError(f"each of {name} is {{id, weight, kwargs, max_turns}}, got {str(entry)[:80]!r}")
            unknown = set(entry) - {"id", "weight", "kwargs", "max_turns"}
            if unknown:
                raise ValueError(f"member {entry['id'][:40]!r}: unknown key(s) {', '.join(sorted(unknown))[:80]}")
            member = {"id": entry["id"]}
            if "weight" in entry:
                member["weight"] = SafeArg(float, 0.001, 1000).check(f"member {entry['id'][:40]!r}'s weight",
                                                                     entry["weight"])
            if entry.get("max_turns") is not None:
                member["max_turns"] = SafeArg(int, 1, 100).check(f"member {entry['id'][:40]!r}'s max_turns",
                                                                 entry["max_turns"])
            if entry["id"] == "mix":
                raise ValueError("a mix's member cannot be a mix")
            member["kwargs"] = entry.get("kwargs") or {}
            checked.append(member)
        return checked
