"""Does a greedy model repeat its reply because of what it said before, or because of where it
stands? At the turns where a validation's greedy reply repeated the one before word for word, the
model's greedy reply again with the conversation as played, and with none of it: the system
prompt, the worked example and the current observation alone.

Greedy SmolLM2 replies on BabyAI repeat the one before 91-98% of the time (docs/RESULTS.md), and
an episode that repeats a useless action spends its turns. If the reply without the conversation
differs, the conversation drives the repeat (a shorter context, `rollout.keep_turns`, would act on
it); if it is the same, the state does: the model maps this observation to this action, and only
training moves that.

    python bench/history_probe.py VALIDATION.jsonl[.gz] [--model smollm2-135m-instruct] [--states 60]
        [--seed 0] [--marker TEXT] [--max-new-tokens 48]

`--marker` keeps only the turns whose observation begins with TEXT (e.g. "That action changed
nothing", BabyAI's `note_unchanged`). Run by hand: one greedy reply at a time, ~4 s a reply for
SmolLM2 on a 2-core CPU; the counts go into docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import torch

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.models import model_folder
from agentgym_rl.errors import UserError
from agentgym_rl.jsonlines import read_json_lines

Message = dict[str, Any]


def opening_size(messages: list[Message]) -> int:
    """How many messages open every episode before its first observation: the system prompt and
    the worked example's turns (assistant messages marked `loss: false`)."""
    size = int(bool(messages) and messages[0]["role"] == "system")
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and message.get("loss") is False:
            size = index + 1
    return size


def repeat_turns(messages: list[Message], marker: str = "") -> list[int]:
    """The indices of the observations after which the episode's reply repeated the reply before
    them word for word (the worked example's left out); with `marker`, only the observations that
    begin with it."""
    first = opening_size(messages)
    return [index for index in range(first + 2, len(messages) - 1)
            if messages[index]["role"] == "user" and messages[index]["content"].startswith(marker)
            and messages[index + 1]["role"] == messages[index - 1]["role"] == "assistant"
            and messages[index + 1]["content"] == messages[index - 1]["content"]]


def contexts(messages: list[Message], index: int) -> tuple[list[Message], list[Message]]:
    """(the conversation as played up to observation `index`, the opening and that observation
    alone), as plain role/content messages."""
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    return plain[:index + 1], plain[:opening_size(messages)] + [plain[index]]


def greedy_reply(model: Any, encoder: ChatEncoder, messages: list[Message], max_new_tokens: int) -> str:
    """The model's greedy reply to `messages`, encoded as a conversation's opening is."""
    prompt = torch.tensor([encoder.start(messages)])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=encoder.end_of_turn_id, pad_token_id=encoder.end_of_turn_id)
    return encoder.decode_reply(out[0, prompt.shape[1]:].tolist())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("validation", type=Path, help="a validation's episodes (.jsonl or .jsonl.gz)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a named model or a folder")
    parser.add_argument("--states", type=int, default=60, help="turns probed, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--marker", default="", help="only observations that begin with this text")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    try:
        turns = [(episode, index) for episode in read_json_lines(args.validation)
                 for index in repeat_turns(episode.get("messages") or [], args.marker)]
        if not turns:
            raise UserError(f"{args.validation}: no reply there repeats the one before"
                            + (f" after an observation beginning {args.marker!r}" if args.marker else ""))
        random.Random(args.seed).shuffle(turns)
        turns = turns[:args.states or None]
        model, tokenizer = load_model_and_tokenizer(model_folder(args.model, log=lambda _: None), "float32")
    except (UserError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model.eval()
    encoder = ChatEncoder(tokenizer)
    again_played = again_alone = 0
    for episode, index in turns:
        played, alone = contexts(episode["messages"], index)
        before = episode["messages"][index - 1]["content"].strip()
        with_history = greedy_reply(model, encoder, played, args.max_new_tokens).strip()
        without = greedy_reply(model, encoder, alone, args.max_new_tokens).strip()
        again_played += with_history == before
        again_alone += without == before
        print(f"{episode.get('item_id', '?')}: before {before.splitlines()[-1]!r}; "
              f"without the conversation {without.splitlines()[-1] if without else ''!r}")
    print(f"\n{len(turns)} turns whose greedy reply repeated the one before: the same reply again "
          f"with the conversation as played {again_played} ({100 * again_played / len(turns):.0f}%), "
          f"without it {again_alone} ({100 * again_alone / len(turns):.0f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
