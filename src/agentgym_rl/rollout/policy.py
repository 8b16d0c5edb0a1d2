"""Policies: what the rollout engine plays with, behind one protocol.

- A token policy (a language model through a `Generator`) has an `encoder`: the engine builds
  each episode's token ids with it, passes them to `act`, and keeps the generated ids, masks and
  logprobs exactly as sampled.
- A text policy (an environment's expert, a random baseline, a remote chat API) has none: it
  replies in text from what the environment's API shows or from the conversation so far, so it
  works through any transport, and the episode is kept as messages.

The engine asks only for this protocol; it never checks which kind of policy it holds.
"""

from __future__ import annotations

import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..agent.chat import ChatEncoder
from ..agent.generator import Generator
from ..envs.base import EnvStateError, TextEnv
from ..errors import UserError


@dataclass
class Reply:
    """One reply: its text and, from a token policy, the ids generated for it.

    Attributes:
        ids: the generated ids (ending with the stop token when `finished`); empty for text.
        logprobs: log-probability of each id under the sampling distribution.
        finished: a stop token ended it (False: it hit the token limit).
        trained: False marks a reply kept in a demonstration as context only (its message gets
            AgentGym's `"loss": false`): a perturbation the expert then recovers from.
        error: why no reply could be made (the environment failed when a text policy asked it,
            e.g. its server went away): the engine ends that episode as failed.
    """

    text: str
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = True
    trained: bool = True
    error: str | None = None


class Policy(Protocol):
    """What the rollout engine plays with.

    Attributes:
        encoder: the chat encoder of a token policy (the engine encodes conversations with it),
            None for a text policy.

    A policy may also define, optional: `max_batch`, the most episodes worth playing at once,
    `cache_bytes_per_token`, the memory each token of an episode in flight holds (its KV cache),
    `writes_summaries` (default True): False for one that never reads the conversation, which
    `rollout.summarize` then does not ask for a summary, and `plays_turns_continuously` with
    `play` (`ModelPolicy.play`): episodes turn after turn in one call (`rollout.continuous_turns`).
    """

    encoder: ChatEncoder | None

    def reset(self) -> None:
        """Forget state kept between `act` calls (a generator's KV cache): the engine calls it
        when a run starts and ends, since weights may change between runs."""
        ...

    def act(self, envs: list[TextEnv], prompts: list[list[int]], max_new_tokens: int,
            conversations: list[list[dict[str, Any]]] | None = None, streams: list[int] | None = None) -> list[Reply]:
        """One reply for each active episode: `envs[i]` is its environment, `prompts[i]` its
        token ids so far (empty lists for a text policy), `conversations[i]` its messages so far
        (what a chat API reads), `streams[i]` the random stream its sampling draws from, so that
        it samples the same whatever it is batched with (`agent.sampling`; None: the process'
        random state; the engine passes it only when a run names a sampling seed)."""
        ...


@dataclass
class ModelPolicy:
    """A language model acting through a `Generator`, encoded token-exactly by `encoder`.

    With `listed_actions_only`, each reply is restricted to "Action: A" for an action A the
    environment lists (constrained decoding, an evaluation aid reported apart from free
    replies; for models trained on action-only replies, `warmup.thoughts: false`)."""

    generator: Generator
    encoder: ChatEncoder
    listed_actions_only: bool = False

    def __post_init__(self) -> None:
        if self.listed_actions_only and not getattr(self.generator, "restricts_replies", False):
            raise UserError(f"{type(self.generator).__name__} cannot restrict replies to the listed actions; "
                            "generate with the Hugging Face model in this process (rollout.generator: hf)")

    def reset(self) -> None:
        reset = getattr(self.generator, "reset", None)  # optional: a generator may keep no state
        if reset is not None:
            reset()

    @property
    def max_batch(self) -> int:
        """Most episodes worth playing at once (0: no limit): a generator keeping its KV cache
        across turns keeps it only for a batch this size; more episodes would be prefilled
        afresh on every turn."""
        return getattr(self.generator, "max_cached_batch", 0)

    @property
    def cache_bytes_per_token(self) -> int:
        """KV-cache bytes a token of an episode in flight holds while it is generated for (0: none
        in this process, e.g. a served model)."""
        return getattr(self.generator, "cache_bytes_per_token", 0)

    def sync_weights(self, model: Any) -> None:
        """Sample from `model`'s weights from now on (see `Generator.sync_weights`)."""
        self.generator.sync_weights(model)

    def act(self, envs: list[TextEnv], prompts: list[list[int]], max_new_tokens: int,
            conversations: list[list[dict[str, Any]]] | None = None, streams: list[int] | None = None) -> list[Reply]:
        options: dict[str, Any] = {} if streams is None else {"streams": streams}
        if self.listed_actions_only:
            options["allowed"] = [self._listed(env) for env in envs]
        return [self._reply(g) for g in self.generator.generate(prompts, max_new_tokens, **options)]

    @property
    def plays_turns_continuously(self) -> bool:
        """Whether `play` can run: the generator refills a call's rows (the slot generator)."""
        return getattr(self.generator, "refills_rows", False) and not self.listed_actions_only

    def play(self, prompts: list[list[int]], max_new_tokens: int,
             next_turns: Callable[[list[tuple[int, Reply]]], "list[tuple[list[int], int | None] | None]"],
             streams: list[int] | None = None) -> None:
        """Episodes turn after turn in one generator call: given the (row, reply) of the rows
        whose replies just ended, `next_turns` returns for each the ids its row continues with
        (its next turn, or another episode's first) and their stream, or None when the row is
        done."""
        options: dict[str, Any] = {} if streams is None else {"streams": streams}
        self.generator.generate(prompts, max_new_tokens, **options,
                                refill=lambda ended: next_turns([(i, self._reply(g)) for i, g in ended]))

    def _reply(self, generation: Any) -> Reply:
        return Reply(self.encoder.decode_reply(generation.ids), list(generation.ids), list(generation.logprobs),
                     generation.finished)

    def _listed(self, env: TextEnv) -> list[list[int]]:
        actions = env.available_actions()
        if not actions:
            raise UserError(f"{type(env.unwrapped).__name__} lists no actions, so replies cannot be restricted "
                            "to them (BabyAI lists them with env.kwargs.list_actions=true)")
        return [self.encoder.encode_text(f"Action: {action}") + [self.encoder.end_of_turn_id] for action in actions]


class TextPolicy(ABC):
    """A policy that replies in text from what each environment's API returns; a subclass
    implements `reply(env)`."""

    encoder: ChatEncoder | None = None
    writes_summaries = False
    """It replies from the environment, not the conversation, so it is never asked for a
    summary (`rollout.summarize`): its windows are cut without one."""

    def reset(self) -> None:
        pass

    def act(self, envs: list[TextEnv], prompts: list[list[int]], max_new_tokens: int,
            conversations: list[list[dict[str, Any]]] | None = None, streams: list[int] | None = None) -> list[Reply]:
        replies = []
        for env in envs:
            try:
                replies.append(Reply(self.reply(env)))
            except (UserError, EnvStateError):  # a mistake of the caller's, not of this episode's environment
                raise
            except Exception as error:  # noqa: BLE001 — the environment failed while asked: that episode fails
                replies.append(Reply("", error=traceback.format_exception_only(type(error), error)[-1].strip()))
        return replies

    @abstractmethod
    def reply(self, env: TextEnv) -> str:
        """The reply (ReAct text, or a bare action) to the environment's current state."""


class ScriptedPolicy(TextPolicy):
    """Any object with `act(env) -> str` (an environment's expert, a hand-written script) as a
    text policy."""

    def __init__(self, scripted: Any):
        self.scripted = scripted

    def reply(self, env: TextEnv) -> str:
        return self.scripted.act(env)


def as_policy(policy: Any) -> Policy:
    """`policy` itself when it follows the `Policy` protocol; an object with only `act(env)`
    (a scripted expert) wrapped in `ScriptedPolicy`."""
    return policy if hasattr(policy, "encoder") else ScriptedPolicy(policy)
