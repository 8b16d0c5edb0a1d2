"""The rollout engine's journal: a run's episodes as they stand at a turn boundary, so that a
process killed mid-rollout continues them instead of playing them again (`rollout.journal_every`).

A journal holds every episode of the run (finished ones whole; unfinished ones with their
tokens so far, their random stream and a snapshot of their environment), the episodes still to
start, and a signature: what the run was asked to play, with what weights. The engine continues
a journal only when the signature is its own, so a journal of other tasks, seeds or weights is
never mistaken for this run's. Like a snapshot it is a pickle: it is read only from the run
folder that wrote it.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1


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
            record = pickle.loads(self.path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("format") == FORMAT else None

    def save(self, signature: dict[str, Any], state: dict[str, Any]) -> int:
        """Write `state` (replacing the last one); returns its bytes."""
        data = pickle.dumps({"format": FORMAT, "signature": {**signature, "key": self.key}, "state": state},
                            protocol=pickle.HIGHEST_PROTOCOL)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_bytes(data)
        os.replace(partial, self.path)  # a kill mid-write leaves the previous journal whole
        return len(data)
