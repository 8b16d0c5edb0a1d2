"""Token-exact multi-turn chat encoding for any chat template.

A trajectory is built as token ids, turn by turn. The model's generated ids are kept exactly
as sampled (never decoded and re-encoded); each environment turn is appended as the token
*delta* that the model's own chat template produces between the end of the assistant's turn
and the start of the next generation. The delta is found by rendering the template with a
placeholder assistant message and cutting at the placeholder, so no template-specific
markers are hard-coded (ARCHITECTURE.md, decision 1).
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError

Message = dict[str, str]

_PLACEHOLDER = "\u2063PLACEHOLDER\u2063"


class ChatEncoder:
    """Encodes conversations for one tokenizer and its chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a `chat_template`.
        end_of_turn: the token that ends an assistant turn (Qwen2.5-Instruct: "<|im_end|>",
            Llama-3-Instruct: "<|eot_id|>"); by default the special token the chat template
            writes right after an assistant message, else the tokenizer's `eos_token`.
    """

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("the tokenizer has no chat_template; use a chat model or set one")
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn or _template_end_of_turn(tokenizer) or tokenizer.eos_token
        if self.end_of_turn is None:
            raise UserError("the tokenizer has no eos_token; pass end_of_turn explicitly")
        end_ids = tokenizer.encode(self.end_of_turn, add_special_tokens=False)
        if len(end_ids) != 1:
            raise UserError(f"end-of-turn marker {self.end_of_turn!r} is not a single token")
        self.end_of_turn_id: int = end_ids[0]

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def start(self, messages: list[Message]) -> list[int]:
        """Ids of the opening messages (system/user) followed by the generation prompt."""
        return self.encode_text(self.render(messages, add_generation_prompt=True))

    def user_delta(self, history: list[Message], user_message: str) -> list[int]:
        """Ids that follow an assistant turn's end-of-turn token up to the next generation.

        Args:
            history: the conversation so far, ending with the assistant turn just generated.
            user_message: the environment's next observation.
        Returns:
            token ids of e.g. "\\n<|im_start|>user\\n{obs}<|im_end|>\\n<|im_start|>assistant\\n".
        """
        if not history or history[-1]["role"] != "assistant":
            raise ValueError("history must end with the assistant turn")
        after = _after_a_reply(self.tokenizer, history[:-1], user_message)
        if not after.startswith(self.end_of_turn):
            raise UserError(
                f"the chat template does not end assistant turns with {self.end_of_turn!r}; "
                "pass the right end_of_turn token"
            )
        return self.encode_text(after[len(self.end_of_turn):])

    def decode_reply(self, generated_ids: list[int]) -> str:
        """The assistant's text from its generated ids (without the end-of-turn token)."""
        if generated_ids and generated_ids[-1] == self.end_of_turn_id:
            generated_ids = generated_ids[:-1]
        return self.tokenizer.decode(generated_ids, skip_special_tokens=False)

    def encode_conversation(self, messages: list[Message],
                            train_on: list[bool] | None = None) -> tuple[list[int], list[int]]:
        """Encode a whole conversation the way a rollout would have built it.

        Used for demonstrations (SFT): assistant replies are encoded from text, everything
        else by the same start/delta rule as rollouts, so training on demonstrations and on
        sampled trajectories sees the same token layout.

        Args:
            messages: system (optional), user, assistant, user, ... as {"role", "content"}.
            train_on: optional, one flag per message (e.g. from AgentGym's per-turn
                ``loss`` flags, `rollout.formats.sft_messages`): an assistant reply whose flag
                is False stays in the ids as context but gets loss_mask 0. A True flag on a
                non-assistant message is a ValueError. None trains every assistant reply.

        Returns:
            (input_ids, loss_mask), both of length T, up to the last assistant turn's
            end-of-turn token: loss_mask[t] = 1 iff token t belongs to a trained assistant
            reply (its text tokens and its end-of-turn token), else 0.
        """
        if train_on is not None:
            if len(train_on) != len(messages):
                raise ValueError(f"train_on has {len(train_on)} flags for {len(messages)} messages")
            for i, (message, flag) in enumerate(zip(messages, train_on)):
                if flag and message["role"] != "assistant":
                    raise ValueError(f"message {i} is a {message['role']!r} message; only assistant replies "
                                     "can be trained")
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not replies:
            raise ValueError("the conversation has no assistant turn")
        ids = self.start(messages[: replies[0]])
        mask = [0] * len(ids)
        for i in range(replies[0], replies[-1] + 1):
            message = messages[i]
            if message["role"] == "assistant":
                reply = self.encode_text(message["content"]) + [self.end_of_turn_id]
                ids += reply
                trained = train_on is None or bool(train_on[i])
                mask += [int(trained)] * len(reply)
            elif message["role"] == "user":
                delta = self.user_delta(messages[:i], message["content"])
                ids += delta
                mask += [0] * len(delta)
            else:
                raise ValueError(f"unexpected {message['role']!r} message after the first reply")
        return ids, mask


def _after_a_reply(tokenizer: Any, before: list[Message], user_message: str) -> str:
    """The template's text between an assistant reply (after `before`) and the generation
    prompt that follows `user_message`: found by rendering a placeholder reply and cutting."""
    probe = [*before, {"role": "assistant", "content": _PLACEHOLDER}, {"role": "user", "content": user_message}]
    text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    return text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER):]


def _template_end_of_turn(tokenizer: Any) -> str | None:
    """The special token the chat template writes right after an assistant message, if any.

    A tokenizer's `eos_token` is not always the end of a turn: Llama-3 ends its text with
    "<|end_of_text|>" and its turns with "<|eot_id|>", and a GGUF file converted by some
    transformers versions names "<|im_start|>" as SmolLM2's eos. The template says which it is.
    """
    try:
        after = _after_a_reply(tokenizer, [{"role": "user", "content": "u"}], "v")
    except Exception:  # noqa: BLE001 — a template that rejects this probe: fall back to eos_token
        return None
    ids = tokenizer.encode(after, add_special_tokens=False)
    # Added tokens count too: a tokenizer may list only bos/eos/unk as special.
    if not ids or (ids[0] not in tokenizer.all_special_ids and ids[0] not in tokenizer.added_tokens_decoder):
        return None
    return tokenizer.convert_ids_to_tokens(ids[0])
