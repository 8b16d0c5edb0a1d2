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

from .agenttraj import (DEFAULT_ACK, agenttraj_to_chat, agenttraj_to_trajectory, chat_to_agenttraj, check_agenttraj,
                        trajectory_to_agenttraj)
from .chat import chat_to_trajectory, check_chat, trajectory_to_chat
from .files import detect_format, load_conversations, read_agenttraj, read_chat, write_agenttraj, write_chat
from .records import AGENTTRAJ, CHAT, RECORD_KEY, Message, Record
from .sft import is_trained, sft_messages

__all__ = [
    "AGENTTRAJ", "CHAT", "DEFAULT_ACK", "RECORD_KEY", "Message", "Record", "agenttraj_to_chat",
    "agenttraj_to_trajectory", "chat_to_agenttraj", "chat_to_trajectory", "check_agenttraj", "check_chat",
    "detect_format", "is_trained", "load_conversations", "read_agenttraj", "read_chat", "sft_messages",
    "trajectory_to_agenttraj", "trajectory_to_chat", "write_agenttraj", "write_chat",
]
