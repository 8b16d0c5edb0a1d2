"""The conversation a trajectory gives supervised fine-tuning, with AgentGym's per-message flags."""

from __future__ import annotations

from ..trajectory import Trajectory
from .records import Message


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
