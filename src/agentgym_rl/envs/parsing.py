"""Extracting the action from a ReAct reply ("Thought: ...\\nAction: ...")."""

from __future__ import annotations

import os
import re
from typing import Callable, Sequence

_ACTION_LINE = re.compile(r"^\s*action\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


MAX_ACTION_CHARS = 1000
"""An action is cut to this length: no environment has a longer one, and an environment that
echoes a rejected action back must not echo a 100 KB reply into the conversation."""


def extract_action(text: str) -> str | None:
    """Return the action of a ReAct reply, or the whole text when it has no `Action:` line.

    The last `Action:` line wins (a model that "corrects itself" means the later one), in
    every environment. The text is made safe for any simulator first: NULs are dropped, lone
    surrogates (text that was not valid UTF-8) become "?", and the action is cut to
    `MAX_ACTION_CHARS`. Returns None for an empty reply or an empty `Action:` line.
    """
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    matches = _ACTION_LINE.findall(text)
    action = matches[-1] if matches else text.strip()
    action = action.strip().strip("`").strip().rstrip(".")
    return action[:MAX_ACTION_CHARS] or None


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THOUGHT_OPENING = re.compile(r"\s*thought\s*:", re.IGNORECASE)


def drop_thought(text: str) -> str:
    """The reply without its thought: from its last `Action:` line on ("Thought: x\nAction:
    y" -> "Action: y"), or, in a tagged reply (Deep Search), without its `<think>...</think>`
    blocks; any other reply is returned unchanged."""
    starts = list(_ACTION_LINE.finditer(text))
    if starts:
        return text[starts[-1].start():].strip()
    return _THINK.sub("", text).strip() if _THINK.search(text) else text


def first_wrong_token(reply_ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                      actions: Sequence[str], finished: bool = True) -> int | None:
    """Index of the reply token at which its action stops being the start of any of `actions`.

    "go to grey key 1" when only "go to green key 1" exists goes wrong at the token that
    brings " grey": the tokens before it are right and the ones after follow from it.
    Compared case-insensitively, as the environments parse actions.

    A reply that opens with a thought and has no `Action:` line went wrong where its action
    line should have begun: at the first token of the line after the thought ("Thought: ...\n
    You can see ..." at "You"). Read as a bare action, the whole reply would be blamed on its
    first token, "Thought", which would teach a model that has just taken up the format to drop
    it (free replies, `rollout.example`).

    Args:
        reply_ids: the reply's token ids.
        decode: ids -> reply text (decoding a prefix of the ids gives a prefix of the text).
        actions: the actions available when the reply was made.
        finished: whether a stop token ended the reply (False: the token limit cut it).

    Returns:
        The token index. When the action stops short of a listed one, the token that ended
        it: the one after it ("go to" then "\n..."), or the stop token that ended the reply.
        None when the action is one of `actions` (the environment refused an action it
        listed), cannot be located in the text, a thought is all the reply holds, or the
        token limit cut the reply inside an action that was still a listed one's start
        (nothing it wrote was wrong).
    """
    reply = decode(reply_ids)
    thought = _THOUGHT_OPENING.match(reply)
    if thought is not None and _ACTION_LINE.search(reply) is None:
        line = reply.find("\n", thought.end())
        rest = reply[line:].lstrip() if line >= 0 else ""
        return _token_at(reply_ids, decode, len(reply) - len(rest)) if rest else None
    action, start = _action_in(reply)
    if action is None or not actions:
        return None
    wanted = action.lower()
    listed = [a.lower() for a in actions]
    if wanted in listed:
        return None
    matched = max(len(os.path.commonprefix([wanted, a])) for a in listed)
    if matched < len(wanted):
        return _token_at(reply_ids, decode, start + matched)
    after = _token_at(reply_ids, decode, start + len(action))
    if after is not None:
        return after
    return len(reply_ids) - 1 if finished and reply_ids else None


def action_token(reply_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> int | None:
    """Index of the reply token that brings the first character of its action ("go" in
    "Thought: ...\nAction: go to red ball 1"): where the choice of action was made. None when
    the reply holds no action that can be found in its text."""
    located = located_action(reply_ids, decode)
    return located[1] if located is not None else None


def located_action(reply_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> tuple[str, int] | None:
    """The reply's action and the index of the reply token that brings its first character
    (`action_token`); None when the reply holds no action that can be found in its text."""
    action, start = _action_in(decode(reply_ids))
    token = _token_at(reply_ids, decode, start) if action is not None else None
    return (action, token) if token is not None else None


def action_verb(action: str) -> str:
    """The word an action begins with, lower-cased: what kind of action it is ("go" for "go to
    red ball 1", "pickup", "toggle", "craft", "get")."""
    words = action.split()
    return words[0].lower() if words else ""


def _token_at(reply_ids: Sequence[int], decode: Callable[[Sequence[int]], str], char: int) -> int | None:
    """Index of the reply token that brings character `char` of the reply's text."""
    for k in range(len(reply_ids)):
        if len(decode(reply_ids[:k + 1])) > char:
            return k
    return None


def right_next_tokens(reply_ids: Sequence[int], wrong: int, decode: Callable[[Sequence[int]], str],
                      encode: Callable[[str], list[int]], actions: Sequence[str]) -> list[int]:
    """Tokens that, in place of reply token `wrong`, would have continued a listed action.

    Each listed action is written into the reply in place of the one it holds (the text
    before the action is kept). Where the text of the reply's first `wrong` tokens starts
    that reply, the first token of the rest of it is a right one. For "Action: pickup grey
    key 1" going wrong at " grey" with "pickup red box 1" listed, that is the token bringing
    " red". Working on text, not ids, also covers prefixes that end inside a word's usual
    token (the model wrote " " then "j"; " count" is one token, but "count" follows " ").

    A reply that went wrong at its action's first token ("pickup" when nothing can be
    picked up) gets none: there the right tokens would be every other verb, always with
    the moves listed in every state, and raising them taught the policy to turn on the
    spot whenever unsure (docs/RESULTS.md). Which action to take is the outcome's call;
    these tokens only repair the rest of an action that began as a listed one.

    Args:
        reply_ids: the reply's token ids; `wrong`: an index into them (`first_wrong_token`).
        decode: ids -> reply text; encode: text -> ids (as the tokenizer writes that text).
        actions: the actions available when the reply was made.

    Returns:
        Distinct token ids in the order of `actions`; empty when no listed action continues
        the reply's first `wrong` tokens, or when token `wrong` starts the action.
    """
    reply = decode(reply_ids)
    action, start = _action_in(reply)
    if action is None:
        return []
    written = decode(reply_ids[:wrong])
    if len(written) <= start:
        return []
    right: list[int] = []
    for listed in actions:
        meant = reply[:start] + listed
        if len(meant) > len(written) and meant.lower().startswith(written.lower()):
            token = encode(meant[len(written):])[0]
            if token not in right:
                right.append(token)
    return right


def _action_in(reply: str) -> tuple[str | None, int]:
    """The reply's action and where it starts in the reply's text; (None, -1) when there is
    none or it cannot be found verbatim."""
    action = extract_action(reply)
    start = reply.rfind(action) if action is not None else -1
    return (action, start) if start >= 0 else (None, -1)
