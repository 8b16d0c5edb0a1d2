"""The constructor arguments a request may set: what the viewer's playground lets a page choose.

Many constructor arguments name an executable (the web env's `chromium`), a file or folder
(`task_file`, `corpus`, `data_root`, a model folder), a URL (`retriever_url`, `judge_url`), or a
size whose cost has no bound (`world_size`, cached per value). Those come only from whoever
starts the process: a config, `--env-arg`. What a request may set is listed per environment in
`EnvSpec.safe_kwargs`, each argument with its type and bounds; every other argument is refused,
so a parameter added to a constructor later stays out of a request's reach until it is listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

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
    """A mix's `members` as a request may give them: registered environments (not a mix), a
    bounded weight and turn limit, and `kwargs` that are each member's own safe arguments."""

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
            member["kwargs"] = checked_kwargs(entry["id"], entry.get("kwargs") or {})
            checked.append(member)
        return checked


def checked_kwargs(env_id: str, kwargs: Any, base: Callable[[str], dict[str, Any]] = lambda env_id: {}) -> dict[str, Any]:
    """`kwargs` of `env_id` as a request gave them, each checked against the environment's
    `safe_kwargs`, over `base(env_id)`: the arguments the process was started with (a mix's
    members get theirs too).

    Raises:
        NotSettable: an argument that is not listed (the message names those that are).
        ValueError: an unknown environment, or a value of the wrong type or out of bounds.
    """
    from . import registry

    if env_id not in registry.env_ids():
        raise ValueError(f"unknown environment {env_id[:40]!r}; registered: {', '.join(registry.env_ids())}")
    if not isinstance(kwargs, dict):
        raise ValueError(f"the arguments of {env_id!r} are a mapping, got {str(kwargs)[:80]!r}")
    safe = registry.spec(env_id).safe_kwargs
    checked = dict(base(env_id))
    for name, value in kwargs.items():
        if name not in safe:
            listed = ", ".join(sorted(safe)) or "none"
            raise NotSettable(f"{env_id}'s argument {str(name)[:40]!r} cannot be set by a request (it can: {listed}); "
                             "the rest come from the command line")
        checked[name] = safe[name].check(f"{env_id}'s {name}", value)
    if env_id == "mix" and "members" in kwargs:
        for member in checked["members"]:  # each member over the arguments its environment was given
            member["kwargs"] = {**base(member["id"]), **member["kwargs"]}
    return checked
