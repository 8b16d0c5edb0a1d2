"""A chat model behind an OpenAI-compatible API (an API model such as GPT-4o, or any served
model) as a text policy: `agentgym-rl eval --policy api:MODEL rollout.generator_url=URL`.

It reads each episode's conversation as the engine keeps it and replies in text through
`POST {base_url}/chat/completions`, so episodes are kept as messages, without token ids: for
evaluating and collecting, not for training (a token policy through `OpenAIGenerator` keeps
exact ids instead).
"""

from __future__ import annotations

from typing import Any

from ..agent.openai_generator import GeneratorError, OpenAIClient
from ..envs.base import TextEnv
from .policy import Reply


class ChatAPIPolicy:
    """Replies of `model` at `base_url` (see the module docstring); `client` counts tokens."""

    encoder = None

    def __init__(self, base_url: str, model: str, temperature: float = 1.0, timeout: float = 60.0,
                 api_key: str | None = None, max_concurrency: int = 4, retries: int = 2):
        self.client = OpenAIClient(base_url, timeout, retries, max_concurrency, api_key)
        self.model = model
        self.temperature = temperature

    def reset(self) -> None:
        pass

    def act(self, envs: list[TextEnv], prompts: list[list[int]], max_new_tokens: int,
            conversations: list[list[dict[str, Any]]] | None = None, streams: list[int] | None = None) -> list[Reply]:
        if conversations is None:
            raise TypeError("a chat API policy replies to conversations: the engine passes them")
        futures = [self.client.pool.submit(self._reply, conversation, max_new_tokens) for conversation in conversations]
        return [Reply(future.result()) for future in futures]

    def _reply(self, conversation: list[dict[str, Any]], max_tokens: int) -> str:
        messages = [{"role": message["role"], "content": message["content"]} for message in conversation]
        answer = self.client.post("/chat/completions", {"model": self.model, "messages": messages,
                                                        "max_tokens": max_tokens, "temperature": self.temperature})
        try:
            return answer["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as error:
            raise GeneratorError(f"{self.client.base_url}/chat/completions answered in an unexpected form: "
                                 f"{error!r}") from None
