"""The rollout engine's journal: a run's episodes as they stand at a turn boundary, so that a
process killed mid-rollout continues them instead of playing them again (`rollout.journal_every`).

A journal holds every episode of the run (finished ones whole; unfinished ones with their
tokens so far, their random stream and a snapshot of their environment), the episodes still to
start, and a signature: what the run was asked to play, with what weights. The engine continues
a journal only when the signature is its own, so a journal of other tasks, seeds or weights is
never mistaken for this run's.

Like a snapshot it is a pickle, and reading a pickle can run code: so a journal is signed with a
key of this user's (`journal_key`, kept outside every run folder), and one whose signature does
not match is never unpickled. Whoever can write into a runs folder cannot make a resume run code.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import pickle
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 2
MAGIC = b"agentgym-rl journal 2\n"
KEY_FILE = "journal.key"


def journal_key() -> bytes:
    """This user's key for signing journals: `<cache>/journal.key` (`models.cache_root`), made
    on first use, readable by this user alone; read once per process and cache folder (a run
    signs a journal every turn)."""
    from ..agent.models import cache_root

    return _key_at(cache_root() / KEY_FILE)


@functools.cache
def _key_at(path: Path) -> bytes:
    try:
        return bytes.fromhex(path.read_text())
    except (OSError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{KEY_FILE}.{os.getpid()}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32))
    try:
        os.link(partial, path)  # the first writer's key wins; a process racing it reads that one
    except FileExistsError:
        pass
    finally:
        partial.unlink()
    return bytes.fromhex(path.read_text())


def _signature(data: bytes) -> bytes:
    return hmac.new(journal_key(), data, hashlib.sha256).digest()


@dataclass
class Journal:
    """Where a run's journal lives and what identifies the run beyond its arguments.

    Attributes:
        path: the journal's file (written whole each time, through a temporary file).
        key: what the caller knows that the engine does not, e.g. the step and a fingerprint of
            the policy's weights; a journal with another key is not continued.
        every: write it every this many turns.
    """

    path: Path
    key: str
    every: int = 1

    def load(self, signature: dict[str, Any]) -> dict[str, Any] | None:
        """The saved state of the run `signature` describes, or None (no journal, another run's,
        or an unreadable one: the run then starts afresh)."""
        record = self._record()
        if record is None or record.get("signature") != {**signature, "key": self.key}:
            return None
        return record["state"]

    def key_on_file(self) -> str | None:
        """The key of the journal at `path`, or None (no journal, or one this format cannot read)."""
        record = self._record()
        return None if record is None else record.get("signature", {}).get("key")

    def _record(self) -> dict[str, Any] | None:
        try:
            raw = self.path.read_bytes()
        except OSError:
            return None
        signature, data = raw[len(MAGIC):len(MAGIC) + 32], raw[len(MAGIC) + 32:]
        if not raw.startswith(MAGIC) or not hmac.compare_digest(signature, _signature(data)):
            return None  # not written by this user's runs: never unpickled
        try:
            record = pickle.loads(data)
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("format") == FORMAT else None

    def save(self, signature: dict[str, Any], state: dict[str, Any]) -> int:
        """Write `state` (replacing the last one); returns its bytes."""
        data = pickle.dumps({"format": FORMAT, "signature": {**signature, "key": self.key}, "state": state},
                            protocol=pickle.HIGHEST_PROTOCOL)
        data = MAGIC + _signature(data) + data
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_bytes(data)
        os.replace(partial, self.path)  # a kill mid-write leaves the previous journal whole
        return len(data)
