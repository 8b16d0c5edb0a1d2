"""Chat-messages records (TRL / OpenAI-style, and our own trajectory JSONL): checking, and
conversion to and from a `Trajectory`."""

from __future__ import annotations

import copy
from typing import Any

from ...errors import UserError
from ..trajectory import Trajectory
from .records import (CHAT, RECORD_KEY, Record, _check_fields, _check_loss, _check_provenance, _plain, _short,
                      _to_trajectory, _top_level)

_CHAT_ROLES = ("system", "user", "assistant")


def check_chat(record: Any) -> None:
    """Raise ValueError (saying what is wrong, without a location) unless `record` is a chat record."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "messages" not in record:
        raise ValueError("missing key 'messages'")
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"'messages' must be a non-empty list of messages, got {_short(messages)}")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ValueError(f"{where} must be an object, got {_short(message)}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"{where} is missing key {key!r}")
        if message["role"] not in _CHAT_ROLES:
            raise ValueError(f"{where}.role is {_short(message['role'])}; expected 'system', 'user' or 'assistant'")
        if message["role"] == "system" and i > 0:
            raise ValueError(f"{where} is a system message; only the first message may be one")
        if not isinstance(message["content"], str):
            raise ValueError(f"{where}.content must be a string, got {_short(message['content'])}")
        _check_loss(where, message)
        for key in ("from", "value"):
            if key in message:
                raise ValueError(f"{where} has the reserved key {key!r}")
        if RECORD_KEY in message:
            if i > 0:
                raise ValueError(f"{where} has the reserved key {RECORD_KEY!r}")
            _check_provenance(where, message[RECORD_KEY])
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no 'assistant' message: nothing to train on")
    _check_fields(record, "messages")


def chat_to_trajectory(record: Record) -> Trajectory:
    """A `Trajectory` from a chat-messages record; fields named like Trajectory's fill them.

    Raises:
        UserError if the record is not a valid chat record.
    """
    try:
        check_chat(record)
    except ValueError as error:
        raise UserError(f"not a chat-messages record: {error}") from None
    return _to_trajectory(record, CHAT, copy.deepcopy(record["messages"]), {})


def trajectory_to_chat(trajectory: Trajectory) -> Record:
    """A chat-messages record from a trajectory; the inverse of `chat_to_trajectory`.

    Messages keep their extra keys (e.g. "loss"). Top-level fields are the source record's if
    it was a chat record, else "item_id" plus the AgentTraj extras, else "item_id", "env_id",
    "category", "success" and "reward".
    """
    messages = [_plain(m) for m in trajectory.messages]
    record = _top_level(trajectory, CHAT, messages,
                        ["messages", "item_id", "env_id", "category", "success", "reward"])
    try:
        check_chat(record)
    except ValueError as error:
        raise UserError(f"trajectory {trajectory.item_id!r} cannot be written as chat messages: {error}") from None
    return record
