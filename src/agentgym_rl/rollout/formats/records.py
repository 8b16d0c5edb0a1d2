"""A conversation record's top-level fields and provenance, shared by both formats: which
fields fill a `Trajectory`, which are kept as extras, and how a record is rebuilt around a
trajectory's turns (see the package docstring)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Callable

from ..trajectory import Trajectory

Message = dict[str, Any]
Record = dict[str, Any]

AGENTTRAJ = "agenttraj"
CHAT = "chat"
RECORD_KEY = "_record"
"""Message key of the provenance record (on the first message only)."""

CONTAINER = {AGENTTRAJ: "conversations", CHAT: "messages"}
"""The key of each format's list of turns."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Top-level fields that fill a `Trajectory` field: name → (what it must be, check). "reward"
# is the outcome reward (`Trajectory.reward`, the sum of `turn_rewards`).
_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **{k: ("a string", lambda v: isinstance(v, str)) for k in ("env_id", "item_id", "category", "error")},
    **{k: ("an integer", _is_int) for k in ("group", "invalid_actions")},
    **{k: ("true or false", lambda v: isinstance(v, bool)) for k in ("success", "terminated", "truncated")},
    **{k: ("a list of integers", lambda v: isinstance(v, list) and all(map(_is_int, v)))
       for k in ("input_ids", "loss_mask", "invalid_turns", "wrong_tokens", "idle_turns", "idle_tokens",
                 "action_tokens", "discovery_tokens")},
    **{k: ("a list of numbers", lambda v: isinstance(v, list) and all(map(_is_number, v)))
       for k in ("logprobs", "turn_rewards")},
    **{k: ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
       for k in ("state_keys", "action_verbs")},
    "right_tokens": ("a list of lists of integers",
                     lambda v: isinstance(v, list) and all(isinstance(x, list) and all(map(_is_int, x)) for x in v)),
    "reward": ("a number", _is_number),
}


def _check_fields(record: Record, container: str) -> None:
    # Null values are not checked: they are kept as extras, not put into a field.
    for key, value in record.items():
        if key != container and key in _FIELDS and value is not None and not _FIELDS[key][1](value):
            raise ValueError(f"{key!r} must be {_FIELDS[key][0]}, got {_short(value)}")


def _split(record: Record, container: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Trajectory keyword arguments, extras) from a record's top-level fields.

    A field goes into the trajectory only if writing the trajectory back gives it unchanged:
    a derived "reward" / "turns" that disagrees with "turn_rewards" stays an extra.
    """
    fields = {k: copy.deepcopy(v) for k, v in record.items()
              if k in _FIELDS and k != "reward" and v is not None}
    held = set(fields)
    reward = record.get("reward")
    if reward is not None:
        if "turn_rewards" not in fields:
            # AgentTraj and most chat datasets give one outcome reward, not one per step.
            fields["turn_rewards"] = [reward]
            held.add("reward")
        elif float(sum(fields["turn_rewards"])) == float(reward):
            held.add("reward")
    turns = record.get("turns")
    if _is_int(turns) and "turn_rewards" in fields and turns == len(fields["turn_rewards"]):
        held.add("turns")
    extras = {k: copy.deepcopy(v) for k, v in record.items() if k != container and k not in held}
    return fields, extras


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_loss(where: str, item: dict) -> None:
    if "loss" in item and item["loss"] is not None and not isinstance(item["loss"], bool):
        raise ValueError(f"{where}.loss must be true, false or null, got {_short(item['loss'])}")


def _check_provenance(where: str, value: Any) -> None:
    if not (isinstance(value, dict) and value.get("format") in CONTAINER
            and isinstance(value.get("keys"), list) and isinstance(value.get("extras"), dict)):
        raise ValueError(f"{where}.{RECORD_KEY} is not a provenance record written by agentgym-rl")


def _env_of(item_id: str) -> str:
    """The env of an AgentGym "<env>_<index>" item id (babyai_12 → babyai), else ""."""
    match = re.fullmatch(r"(.+)_\d+", item_id)
    return match.group(1) if match else ""


def _to_trajectory(record: Record, fmt: str, messages: list[Message], provenance: dict[str, Any]) -> Trajectory:
    fields, extras = _split(record, CONTAINER[fmt])
    fields.setdefault("item_id", "")
    fields.setdefault("env_id", _env_of(fields["item_id"]))
    fields.setdefault("category", "")
    # A record that already carries provenance is one of ours (save_trajectories of a
    # converted trajectory): the source recorded there is the one to write back to.
    if RECORD_KEY not in messages[0]:
        provenance.update(format=fmt, keys=list(record), extras=extras)
        messages[0][RECORD_KEY] = provenance
    return Trajectory(messages=messages, **fields)


def _provenance(trajectory: Trajectory) -> dict[str, Any]:
    return trajectory.messages[0].get(RECORD_KEY, {}) if trajectory.messages else {}


def _field_value(trajectory: Trajectory, key: str) -> Any:
    if key == "reward":
        # One entry is the record's own reward: give it back as written (1 stays 1, not 1.0).
        rewards = trajectory.turn_rewards
        return rewards[0] if len(rewards) == 1 else trajectory.reward
    if key == "turns":
        return trajectory.turns
    return copy.deepcopy(getattr(trajectory, key))


def _top_level(trajectory: Trajectory, fmt: str, conversation: list[dict], defaults: list[str]) -> Record:
    """The record around `conversation`: the source's keys in order if it had this format."""
    container = CONTAINER[fmt]
    provenance = _provenance(trajectory)
    if provenance.get("format") == fmt:
        keys = provenance["keys"]
    elif provenance:
        # From the other format: its container key is replaced by ours (an extra field that
        # happens to be named like our container is dropped: it cannot coexist with it).
        other = CONTAINER[provenance["format"]]
        keys = defaults[:2] + [k for k in provenance["keys"] if k not in (other, *defaults[:2])]
    else:
        keys = defaults
    extras = provenance.get("extras", {})
    record: Record = {}
    for key in keys:
        if key == container:
            record[key] = conversation
        elif key in extras:
            record[key] = copy.deepcopy(extras[key])
        else:
            record[key] = _field_value(trajectory, key)
    return record


def _plain(message: Message) -> Message:
    return {k: copy.deepcopy(v) for k, v in message.items() if k != RECORD_KEY}
