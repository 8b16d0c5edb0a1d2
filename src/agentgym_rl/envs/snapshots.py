"""The bytes of `TextEnv.snapshot`: which environment wrote them, and its state.

A snapshot is a pickle, so restoring one runs whatever it names: it is only ever read from
where this process (or an env server, which signs what it hands out: `server.app`) wrote it.
"""

from __future__ import annotations

import pickle
from typing import Any

FORMAT = 1
"""Bumped when a snapshot's layout changes; an older one is refused, not misread."""


def dump(env_id: str, state: Any) -> bytes:
    """`state` (any picklable value) as the snapshot of environment `env_id`."""
    return pickle.dumps({"format": FORMAT, "env_id": env_id, "state": state}, protocol=pickle.HIGHEST_PROTOCOL)


def load(env_id: str, data: bytes) -> Any:
    """The state in a snapshot `dump` wrote for `env_id`; a ValueError for anything else."""
    try:
        record = pickle.loads(data)
    except Exception as error:  # noqa: BLE001 — any unreadable bytes are one kind of mistake
        raise ValueError(f"not an environment snapshot ({type(error).__name__})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or "state" not in record:
        raise ValueError("not an environment snapshot of this version")
    if record.get("env_id") != env_id:
        raise ValueError(f"a snapshot of {record.get('env_id')!r} cannot be restored into {env_id!r}")
    return record["state"]
