"""Conversation files: AgentGym's AgentTraj JSONL, plain chat-messages JSONL, and our `Trajectory`.

Two file formats, one JSON object per line:

* **AgentTraj** (AgentGym's SFT data)::

      {"item_id": "babyai_12", "conversations": [
          {"from": "human", "loss": null,  "value": "<instruction>"},
          {"from": "gpt",   "loss": false, "value": "OK. I'll follow your instructions ..."},
          {"from": "human", "loss": null,  "value": "<first observation>"},
          {"from": "gpt",   "loss": true,  "value": "Thought: ...\\nAction: ..."}, ...]}

  AgentGym has no system role: the first human turn carries the instruction and a gpt
  acknowledgement with ``"loss": false`` follows it. ``loss`` says whether a gpt turn is
  trained: true or null (or absent) = trained, false = context only. Human turns are never
  trained, whatever their flag says.

* **chat messages** (the layout of TRL / OpenAI-style datasets, and of our own trajectory
  JSONL)::

      {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}], ...fields}

  An assistant message may carry the same optional ``"loss": bool|null`` flag.

How the conversion into a `Trajectory` keeps everything (so AgentTraj → Trajectory →
AgentTraj, and chat → Trajectory → chat, give back equal records, key order included):

* turns become messages key by key: ``from``→``role`` (human→user, gpt→assistant),
  ``value``→``content``; every other key of a turn (``loss`` included, and whether it was
  there at all) stays on the message as is. Chat templates and `ChatEncoder` read only
  ``role`` and ``content``, so extra keys are harmless there.
* top-level fields named like a `Trajectory` field (``item_id``, ``env_id``, ``category``,
  ``success``, ``turn_rewards``, ...) fill that field; ``reward`` fills ``turn_rewards`` as
  one entry when no per-turn rewards are given. Everything else, and the order of all keys,
  is kept verbatim in a provenance record on the first message under the key ``"_record"``:
  ``{"format": "agenttraj"|"chat", "keys": [...], "extras": {...}}``. `Trajectory` has no
  free-form field, and the first message travels with the trajectory through
  `save_trajectories` / `load_trajectories` and every trainer that copies ``messages``.
  Writing a trajectory back uses the current values of the mirrored fields (so a relabelled
  ``success`` is written as relabelled) and the stored extras for the rest.
* a trajectory with no provenance record (a rollout) is written with ``item_id``,
  ``success`` and ``reward`` (chat: also ``env_id`` and ``category``). Written as AgentTraj,
  messages not read from AgentTraj get AgentGym's flags where they have none: ``loss: null``
  on human turns, ``loss: true`` on gpt turns.
* our system message becomes AgentGym's opening pair (human instruction + gpt
  acknowledgement with ``loss: false``), or, with ``ack=None``, is prepended to the first
  user turn. Reading with ``instruction_as_system=True`` does the reverse (the first human
  turn becomes the system message and the acknowledgement is set aside in the provenance
  record, so the round trip stays lossless), which gives AgentTraj demonstrations the same
  layout as our rollouts.

JSON numbers are compared as values: a reward written as ``1`` stays ``1`` when it is the only
turn reward, but a reward recomputed from several turn rewards is written as a float.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..errors import UserError
from .trajectory import Trajectory

Message = dict[str, Any]
Record = dict[str, Any]

AGENTTRAJ = "agenttraj"
CHAT = "chat"
RECORD_KEY = "_record"
"""Message key of the provenance record (on the first message only)."""
DEFAULT_ACK = "OK. I'll follow your instructions and try my best to solve the task."
"""The acknowledgement AgentGym puts after the instruction turn (never trained)."""

_FROM_TO_ROLE = {"human": "user", "gpt": "assistant"}
_CHAT_ROLES = ("system", "user", "assistant")
_CONTAINER = {AGENTTRAJ: "conversations", CHAT: "messages"}
_MISSING = object()


# ------------------------------------------------------------------------------ schema


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
       for k in ("input_ids", "loss_mask", "invalid_turns", "wrong_tokens")},
    **{k: ("a list of numbers", lambda v: isinstance(v, list) and all(map(_is_number, v)))
       for k in ("logprobs", "turn_rewards")},
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
    if not (isinstance(value, dict) and value.get("format") in _CONTAINER
            and isinstance(value.get("keys"), list) and isinstance(value.get("extras"), dict)):
        raise ValueError(f"{where}.{RECORD_KEY} is not a provenance record written by agentgym-rl")


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


# --------------------------------------------------------------------------------- files


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
        elif detected not in (None, fmt) and _CONTAINER[fmt] not in record:
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


# ---------------------------------------------------------------------------- converters


def _env_of(item_id: str) -> str:
    """The env of an AgentGym "<env>_<index>" item id (babyai_12 → babyai), else ""."""
    match = re.fullmatch(r"(.+)_\d+", item_id)
    return match.group(1) if match else ""


def _to_trajectory(record: Record, fmt: str, messages: list[Message], provenance: dict[str, Any]) -> Trajectory:
    fields, extras = _split(record, _CONTAINER[fmt])
    fields.setdefault("item_id", "")
    fields.setdefault("env_id", _env_of(fields["item_id"]))
    fields.setdefault("category", "")
    # A record that already carries provenance is one of ours (save_trajectories of a
    # converted trajectory): the source recorded there is the one to write back to.
    if RECORD_KEY not in messages[0]:
        provenance.update(format=fmt, keys=list(record), extras=extras)
        messages[0][RECORD_KEY] = provenance
    return Trajectory(messages=messages, **fields)


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
    container = _CONTAINER[fmt]
    provenance = _provenance(trajectory)
    if provenance.get("format") == fmt:
        keys = provenance["keys"]
    elif provenance:
        # From the other format: its container key is replaced by ours (an extra field that
        # happens to be named like our container is dropped: it cannot coexist with it).
        other = _CONTAINER[provenance["format"]]
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


def agenttraj_to_chat(record: Record, *, instruction_as_system: bool = False) -> Record:
    """AgentTraj record → chat record ("from"/"value" → "role"/"content"; extras kept)."""
    return trajectory_to_chat(agenttraj_to_trajectory(record, instruction_as_system=instruction_as_system))


def chat_to_agenttraj(record: Record, *, ack: str | None = DEFAULT_ACK) -> Record:
    """Chat record → AgentTraj record (system → instruction turn + `ack`; extras kept)."""
    return trajectory_to_agenttraj(chat_to_trajectory(record), ack=ack)


# ------------------------------------------------------------------------------------ SFT


def is_trained(message: Message) -> bool:
    """AgentGym's rule: assistant messages are trained unless "loss" is false; others never."""
    return message["role"] == "assistant" and message.get("loss") is not False


def sft_messages(trajectory: Trajectory) -> tuple[list[dict[str, str]], list[bool]]:
    """The conversation for supervised fine-tuning, with a per-message training flag.

    Returns:
        messages: [{"role", "content"}] with all other keys (loss flags, provenance) removed,
            ready for a chat template.
        train_on: one bool per message, True on the assistant messages that carry loss
            (`is_trained`). All False means the trajectory has nothing to train on.
    """
    messages = [{"role": m["role"], "content": m["content"]} for m in trajectory.messages]
    return messages, [is_trained(m) for m in trajectory.messages]
