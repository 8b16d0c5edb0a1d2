"""AgentGym's AgentTraj records: checking, and conversion to and from a `Trajectory`."""

from __future__ import annotations

import copy
from typing import Any

from ...errors import UserError
from ..trajectory import Trajectory
from .chat import chat_to_trajectory, trajectory_to_chat
from .records import (AGENTTRAJ, RECORD_KEY, Message, Record, _check_fields, _check_loss, _plain, _provenance, _short,
                      _to_trajectory, _top_level)

DEFAULT_ACK = "OK. I'll follow your instructions and try my best to solve the task."
"""The acknowledgement AgentGym puts after the instruction turn (never trained)."""

_FROM_TO_ROLE = {"human": "user", "gpt": "assistant"}
_MISSING = object()


def check_agenttraj(record: Any) -> None:
    """Raise ValueError (saying what is wrong, without a location) unless `record` is AgentTraj."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    for key in ("item_id", "conversations"):
        if key not in record:
            raise ValueError(f"missing key {key!r} (an AgentTraj record needs 'item_id' and 'conversations')")
    if not isinstance(record["item_id"], str) or not record["item_id"]:
        raise ValueError(f"'item_id' must be a non-empty string, got {_short(record['item_id'])}")
    turns = record["conversations"]
    if turns is None:
        raise ValueError("'conversations' is null: this is an evaluation item list, not trajectories")
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"'conversations' must be a non-empty list of turns, got {_short(turns)}")
    for i, turn in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise ValueError(f"{where} must be an object, got {_short(turn)}")
        for key in ("from", "value"):
            if key not in turn:
                raise ValueError(f"{where} is missing key {key!r}")
        if turn["from"] not in _FROM_TO_ROLE:
            raise ValueError(f"{where}.from is {_short(turn['from'])}; expected 'human' or 'gpt'")
        if not isinstance(turn["value"], str):
            raise ValueError(f"{where}.value must be a string, got {_short(turn['value'])}")
        _check_loss(where, turn)
        # These keys are what a turn's keys turn into in a message; a turn holding them too
        # could not be told apart on the way back.
        for key in ("role", "content", RECORD_KEY):
            if key in turn:
                raise ValueError(f"{where} has the reserved key {key!r}")
    if not any(turn["from"] == "gpt" for turn in turns):
        raise ValueError("the conversation has no 'gpt' turn: nothing to train on")
    _check_fields(record, "conversations")


def _message(turn: dict[str, Any]) -> Message:
    """A message from an AgentTraj turn, key by key in the turn's order."""
    message = {}
    for key, value in turn.items():
        if key == "from":
            message["role"] = _FROM_TO_ROLE[value]
        elif key == "value":
            message["content"] = value
        else:
            message[key] = copy.deepcopy(value)
    return message


def agenttraj_to_trajectory(record: Record, *, instruction_as_system: bool = False) -> Trajectory:
    """A text-only `Trajectory` from an AgentTraj record; see the module docstring.

    Args:
        record: {"item_id", "conversations", ...extras}.
        instruction_as_system: make the first human turn the system message and set aside the
            acknowledgement that follows it (a gpt turn with loss false, if a later gpt turn
            exists), giving the layout of our rollouts: system, observation, reply, ...
    Returns:
        a Trajectory with messages only (no token ids); env_id from the item id
        ("babyai_12" → "babyai") unless the record has "env_id".
    Raises:
        UserError if the record is not valid AgentTraj.
    """
    try:
        check_agenttraj(record)
    except ValueError as error:
        raise UserError(f"not an AgentTraj record: {error}") from None
    turns = record["conversations"]
    messages = [_message(turn) for turn in turns]
    provenance: dict[str, Any] = {}
    if instruction_as_system and turns[0]["from"] == "human":
        messages[0]["role"] = "system"
        acknowledged = (len(turns) > 1 and turns[1]["from"] == "gpt" and turns[1].get("loss") is False
                        and any(t["from"] == "gpt" for t in turns[2:]))
        # Kept so that writing back restores the exact turn; None = there was none to restore.
        provenance["ack"] = copy.deepcopy(turns[1]) if acknowledged else None
        if acknowledged:
            del messages[1]
    return _to_trajectory(record, AGENTTRAJ, messages, provenance)


def _turn(message: Message, default_loss: bool) -> dict[str, Any]:
    """An AgentTraj turn from a message, key by key in the message's order.

    With `default_loss`, a message without "loss" gets AgentGym's rollout default right after
    "from": null on human turns, true on gpt turns. (Off for messages read from AgentTraj,
    where an absent flag was absent in the source.)
    """
    turn: dict[str, Any] = {}
    for key, value in _plain(message).items():
        if key == "role":
            turn["from"] = "gpt" if value == "assistant" else "human"
            if default_loss and "loss" not in message:
                turn["loss"] = True if value == "assistant" else None
        elif key == "content":
            turn["value"] = value
        else:
            turn[key] = value
    return turn


def trajectory_to_agenttraj(trajectory: Trajectory, *, ack: str | None = DEFAULT_ACK) -> Record:
    """An AgentTraj record from a trajectory; the inverse of `agenttraj_to_trajectory`.

    Args:
        trajectory: any trajectory with at least one assistant message.
        ack: a leading system message becomes a human turn followed by a gpt turn with this
            text and loss false (AgentGym's layout). None prepends the system text to the
            first user turn instead ("{system}\\n\\n{user}"). Ignored when the trajectory was
            read with `instruction_as_system=True`: the original turns are restored.
    Returns:
        {"item_id", "conversations", ...}: the source record's keys if it came from AgentTraj,
        else the other format's extra fields, else "success" and "reward".
    Raises:
        UserError if the result would not be valid AgentTraj (e.g. no assistant message).
    """
    messages = trajectory.messages
    provenance = _provenance(trajectory)
    default_loss = provenance.get("format") != AGENTTRAJ
    turns: list[dict[str, Any]] = []
    rest = messages
    if messages and messages[0]["role"] == "system":
        restore = provenance.get("ack", _MISSING)
        if restore is _MISSING and ack is None and len(messages) > 1 and messages[1]["role"] == "user":
            first = _turn(messages[1], default_loss)
            first["value"] = f"{messages[0]['content']}\n\n{first['value']}"
            turns.append(first)
            rest = messages[2:]
        else:
            turns.append(_turn(messages[0], default_loss))
            if restore is _MISSING and ack is not None:
                turns.append({"from": "gpt", "loss": False, "value": ack})
            elif restore not in (_MISSING, None):
                turns.append(copy.deepcopy(restore))
            rest = messages[1:]
    turns += [_turn(m, default_loss) for m in rest]
    record = _top_level(trajectory, AGENTTRAJ, turns, ["item_id", "conversations", "success", "reward"])
    try:
        check_agenttraj(record)
    except ValueError as error:
        raise UserError(f"trajectory {trajectory.item_id!r} cannot be written as AgentTraj: {error}") from None
    return record


def agenttraj_to_chat(record: Record, *, instruction_as_system: bool = False) -> Record:
    """AgentTraj record → chat record ("from"/"value" → "role"/"content"; extras kept)."""
    return trajectory_to_chat(agenttraj_to_trajectory(record, instruction_as_system=instruction_as_system))


def chat_to_agenttraj(record: Record, *, ack: str | None = DEFAULT_ACK) -> Record:
    """Chat record → AgentTraj record (system → instruction turn + `ack`; extras kept)."""
    return trajectory_to_agenttraj(chat_to_trajectory(record), ack=ack)
