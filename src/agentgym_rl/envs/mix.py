"""Several environments as one: a multi-task run's environment (`env.id: mix`).

`env.kwargs.members` lists the environments and how each is used:

    env:
      id: mix
      kwargs:
        members:
          - {id: babyai, weight: 1, kwargs: {list_actions: true}, max_turns: 20}
          - {id: textcraft, weight: 1, max_turns: 30}

A task of the mix is a task of one member, named as that member names it ("babyai_12",
"textcraft_5"), so trajectories, metrics and per-item comparisons keep saying which
environment an episode was; `reset` plays it in that member. Each member keeps its own turn
limit (`max_turns`, by default its registered one) and system prompt, and the trainer draws
each step's tasks from the members in proportion to their `weight` (`member_quotas`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError
from . import snapshots
from .base import EnvStateError, StepResult, TextEnv
from .tasks import Task


@dataclass(frozen=True)
class Member:
    """One environment of a mix: its id, share of each step's tasks, arguments and turn limit."""

    id: str
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None


def parse_members(members: Any) -> list[Member]:
    """`env.kwargs.members` as `Member`s; a ValueError saying what is wrong otherwise."""
    from . import registry

    if not isinstance(members, list) or not members:
        raise ValueError("the mix needs env.kwargs.members: a list of {id, weight, kwargs, max_turns}")
    parsed = []
    for entry in members:
        if not isinstance(entry, dict) or "id" not in entry:
            raise ValueError(f"each member is {{id, weight, kwargs, max_turns}}, got {entry!r}")
        unknown = set(entry) - {"id", "weight", "kwargs", "max_turns"}
        if unknown:
            raise ValueError(f"member {entry['id']!r}: unknown key(s) {', '.join(sorted(unknown))} "
                             "(known: id, weight, kwargs, max_turns)")
        weight, kwargs = entry.get("weight", 1.0), entry.get("kwargs") or {}
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not isinstance(kwargs, dict):
            raise ValueError(f"member {entry['id']!r}: weight is a number and kwargs a mapping, got "
                             f"{weight!r} and {kwargs!r}")
        member = Member(str(entry["id"]), float(weight), dict(kwargs), entry.get("max_turns"))
        if member.id == "mix" or member.id not in registry.env_ids():
            raise ValueError(f"member {member.id!r} is not an environment; registered: "
                             f"{', '.join(e for e in registry.env_ids() if e != 'mix')}")
        if not (member.weight > 0 and math.isfinite(member.weight)):
            raise ValueError(f"member {member.id!r}: weight must be > 0, got {member.weight}")
        if member.max_turns is not None and (not isinstance(member.max_turns, int) or member.max_turns < 1):
            raise ValueError(f"member {member.id!r}: max_turns must be a positive integer, got {member.max_turns!r}")
        parsed.append(member)
    ids = [m.id for m in parsed]
    if len(set(ids)) != len(ids):
        raise ValueError(f"each environment may be a member once, got {', '.join(ids)}")
    return parsed


def check_members(members: Any = None) -> int:
    """Build and close each member once, so that a bad argument of one is an error before any work
    (the mix's `EnvSpec.check_entry_point`, run by `registry.env_factory`). Returns the fewest
    instances a member allows alive at once (`EnvSpec.max_parallel`; 0: no limit), which the
    mix then keeps."""
    from . import registry

    limits = []
    for member in parse_members(members):
        try:
            registry.make(member.id, **member.kwargs).close()
        except (TypeError, ValueError) as error:
            raise ValueError(f"member {member.id!r}: {error}") from None
        limits.append(registry.spec(member.id).max_parallel)
    return min([limit for limit in limits if limit], default=0)


def check_members_installed(members: Any = None) -> None:
    """What each member needs installed (the mix's `EnvSpec.installed_entry_point`)."""
    from . import registry

    try:
        parsed = parse_members(members)
    except ValueError as error:
        raise UserError(f"bad arguments for environment 'mix': {error}") from None
    for member in parsed:
        registry.check_installed(member.id, member.kwargs)


def mix_tasks(split: str, members: Any = None) -> list[Task]:
    """The members' tasks of `split`, interleaved by weight (`interleave`), each member's in its
    own order: the first n tasks of the mix (the warm-up's demonstrations, a validation of n
    items) hold every member in proportion to its weight."""
    from . import registry

    parsed = parse_members(members)
    return interleave([registry.tasks(m.id, split, m.kwargs) for m in parsed], [m.weight for m in parsed])


def interleave(lists: list[list[Task]], weights: list[float]) -> list[Task]:
    """All items of `lists`, each list's in order, taking next from the list furthest behind its
    share (weight / total weight of the lists not yet used up) of the items taken so far; ties
    go to the earlier list.

    Example: lists [a1 a2 a3 a4], [b1 b2], weights [1, 1] -> a1 b1 a2 b2 a3 a4."""
    taken = [0] * len(lists)
    out: list[Task] = []
    size = sum(map(len, lists))
    while len(out) < size:
        left = [i for i, items in enumerate(lists) if taken[i] < len(items)]
        total = sum(weights[i] for i in left)
        # The list whose count is furthest below its share of the next position.
        pick = min(left, key=lambda i: (taken[i] - (len(out) + 1) * weights[i] / total, i))
        out.append(lists[pick][taken[pick]])
        taken[pick] += 1
    return out


def member_quotas(weights: list[float], total: int) -> list[int]:
    """How many of `total` tasks each member gets: proportional to `weights`, rounded by largest
    remainder (ties to the earlier member), so the counts sum to `total`.

    Example: weights [1, 1, 2], total 6 -> [2, 1, 3] (exact shares 1.5, 1.5, 3)."""
    shares = [total * w / sum(weights) for w in weights]
    counts = [math.floor(s) for s in shares]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


def task_pools(env_id: str, env_kwargs: dict[str, Any], tasks: list[Task]) -> list[tuple[float, list[Task]]]:
    """(weight, tasks) of each member a step draws from: one pool of all `tasks` for one environment."""
    if env_id != "mix":
        return [(1.0, tasks)]
    return [(m.weight, [t for t in tasks if t.env_id == m.id]) for m in parse_members(env_kwargs.get("members"))]


class MixEnv(TextEnv):
    """Plays each task in the member it belongs to (see the module docstring)."""

    env_id = "mix"

    def __init__(self, members: Any = None) -> None:
        from . import registry

        self.members = {m.id: m for m in parse_members(members)}
        self._envs: dict[str, TextEnv] = {}  # made on a member's first task, then reused
        self._active: TextEnv | None = None
        self._registry = registry

    def _member_env(self, env_id: str) -> TextEnv:
        if env_id not in self._envs:
            member = self.members[env_id]
            limit = member.max_turns or self._registry.spec(env_id).max_turns
            self._envs[env_id] = self._registry.make(env_id, max_turns=limit, **member.kwargs)
        return self._envs[env_id]

    @property
    def instruction(self) -> str:  # type: ignore[override]
        """The system prompt of the member now playing ("" before the first reset)."""
        return self._active.instruction if self._active is not None else ""

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if not isinstance(item_id, str) or "_" not in item_id:
            raise ValueError(f"a mix plays a member's task, named '<env>_<index>' (one of "
                             f"{', '.join(self.members)}), got {item_id!r}")
        env_id = item_id.rsplit("_", 1)[0]
        if env_id not in self.members:
            raise ValueError(f"{item_id!r} is not a task of this mix's members ({', '.join(self.members)})")
        self._active = self._member_env(env_id)
        observation, info = self._active.reset(item_id, seed)
        return observation, {**info, "env_id": env_id}

    def step(self, action: str) -> StepResult:
        if self._active is None:
            raise EnvStateError("call reset before step")
        return self._active.step(action)

    def available_actions(self) -> list[str] | None:
        return self._active.available_actions() if self._active is not None else None

    def expert_action(self) -> str | None:
        return self._active.expert_action() if self._active is not None else None

    def snapshot(self) -> bytes:
        """The member now playing and its own snapshot."""
        if self._active is None:
            raise EnvStateError("call reset before snapshot")
        member = next(env_id for env_id, env in self._envs.items() if env is self._active)
        return snapshots.dump(self.env_id, (member, self._active.snapshot()))

    def restore(self, state: bytes) -> None:
        member, inner = snapshots.load(self.env_id, state)
        if member not in self.members:
            raise ValueError(f"a snapshot of member {member!r}, which this mix does not have")
        self._active = self._member_env(member)
        self._active.restore(inner)

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs, self._active = {}, None
