"""Conversation JSONL files: reading (format detected, every line checked, errors naming file
and line) and writing (nothing written unless every record is valid)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from ...errors import UserError
from ..trajectory import Trajectory
from .agenttraj import agenttraj_to_trajectory, check_agenttraj
from .chat import chat_to_trajectory, check_chat
from .records import AGENTTRAJ, CHAT, CONTAINER, Record


def detect_format(record: Any) -> str | None:
    """The format of a parsed record: `AGENTTRAJ` ("conversations"), `CHAT` ("messages") or None."""
    if isinstance(record, dict):
        if "conversations" in record:
            return AGENTTRAJ
        if "messages" in record:
            return CHAT
    return None


_CHECKS = {AGENTTRAJ: check_agenttraj, CHAT: check_chat}
_NAMES = {AGENTTRAJ: "AgentTraj", CHAT: "chat-messages"}


def _jsonl(path: str | Path, what: str) -> Iterator[tuple[int, Any]]:
    """(1-based line number, parsed JSON) of each non-blank line; errors name file and line."""
    source = Path(path)
    if not source.exists():
        raise UserError(f"{what} file {str(path)!r} does not exist")
    if not source.is_file():
        raise UserError(f"{what} file {str(path)!r} is not a file")
    # Bytes, decoded line by line: a text-mode reader decodes in chunks and would report a
    # bad byte at the line being read when the chunk was, not at the line that holds it.
    with source.open("rb") as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{path}:{line_number}: not UTF-8 text") from None
            if line_number == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark some editors write
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"{path}:{line_number}: invalid JSON ({error.msg}, column {error.colno})") from None


def _read(path: str | Path, fmt: str | None) -> list[tuple[str, Record]]:
    """Validated (format, record) pairs; `fmt` None = the format of the first record."""
    records: list[tuple[str, Record]] = []
    first_line = None
    for line_number, record in _jsonl(path, _NAMES[fmt] if fmt else "conversation"):
        detected = detect_format(record)
        if fmt is None:
            if detected is None:
                keys = ", ".join(map(repr, record)) if isinstance(record, dict) else type(record).__name__
                raise UserError(f"{path}:{line_number}: neither an AgentTraj record (needs 'conversations') "
                                f"nor a chat record (needs 'messages'); got {keys}")
            fmt, first_line = detected, line_number
        elif detected not in (None, fmt) and CONTAINER[fmt] not in record:
            origin = f" (line {first_line} set the format; use one format per file)" if first_line else ""
            raise UserError(f"{path}:{line_number}: {_NAMES[detected]} record where {_NAMES[fmt]} "
                            f"records were expected{origin}")
        try:
            _CHECKS[fmt](record)
        except ValueError as error:
            raise UserError(f"{path}:{line_number}: {error}") from None
        records.append((fmt, record))
    return records


def read_agenttraj(path: str | Path) -> list[Record]:
    """The validated records of an AgentTraj JSONL file.

    Raises:
        UserError naming the file (and the 1-based line) if the file is missing, a line is
        not JSON, a record breaks the schema or has no gpt turn.
    """
    return [record for _, record in _read(path, AGENTTRAJ)]


def read_chat(path: str | Path) -> list[Record]:
    """The validated records of a chat-messages JSONL file (errors as `read_agenttraj`)."""
    return [record for _, record in _read(path, CHAT)]


def load_conversations(path: str | Path, *, instruction_as_system: bool = False) -> list[Trajectory]:
    """Text-only trajectories from an AgentTraj or a chat-messages JSONL file (auto-detected).

    The first record decides the format; our own trajectory JSONL (`save_trajectories`) is a
    chat-messages file and loads here too.

    Args:
        path: the JSONL file.
        instruction_as_system: AgentTraj only; see `agenttraj_to_trajectory`.
    Raises:
        UserError naming the file and line (missing file, bad JSON, bad schema, mixed formats).
    """
    return [agenttraj_to_trajectory(record, instruction_as_system=instruction_as_system) if fmt == AGENTTRAJ
            else chat_to_trajectory(record) for fmt, record in _read(path, None)]


def _write(records: Iterable[Record], path: str | Path, fmt: str) -> None:
    checked = []
    for index, record in enumerate(records):
        try:
            _CHECKS[fmt](record)
        except ValueError as error:
            raise UserError(f"record {index} is not a valid {_NAMES[fmt]} record: {error}") from None
        checked.append(record)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for record in checked:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_agenttraj(records: Iterable[Record], path: str | Path) -> None:
    """Validate AgentTraj records and write one per line (nothing is written if one is invalid)."""
    _write(records, path, AGENTTRAJ)


def write_chat(records: Iterable[Record], path: str | Path) -> None:
    """Validate chat-messages records and write one per line (nothing is written if one is invalid)."""
    _write(records, path, CHAT)
