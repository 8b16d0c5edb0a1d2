"""Environments played from the browser: by hand, or a run's newest checkpoint choosing the reply.

A session is an environment instance reset to one item plus the conversation so far. The model
sees that conversation as the rollouts of its run built it (the run's `rollout.system_prompt`
and `max_new_tokens`, greedy), re-encoded from text: with a byte-level tokenizer the same ids.
"""

from __future__ import annotations

import base64
import io
import itertools
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..envs import registry
from ..envs.base import EnvStateError, TextEnv
from ..errors import UserError
from ..runs import latest_model, played_settings

MAX_ACTION_CHARS = 10_000
MAX_SESSIONS = 8
"""Sessions kept alive; starting one more closes the least recently used."""


class PlaygroundError(Exception):
    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


def grid_image(env: TextEnv) -> str | None:
    """A PNG (base64) of a BabyAI grid as the agent's world is now, else None."""
    minigrid = getattr(env.unwrapped, "minigrid_env", None)
    if minigrid is None:
        return None
    import matplotlib.image

    buffer = io.BytesIO()
    matplotlib.image.imsave(buffer, minigrid.get_frame(highlight=True, tile_size=24), format="png")
    return base64.b64encode(buffer.getvalue()).decode()


class _Session:
    def __init__(self, env: TextEnv, item_id: Any, observation: str):
        self.env = env
        self.item_id = item_id
        self.messages: list[dict[str, str]] = [{"role": "user", "content": observation}]
        self.done = False
        self.total_reward = 0.0
        self.lock = threading.Lock()


class Playground:
    """Live sessions, and the models that have acted in them (one per run, loaded once)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[int, _Session] = OrderedDict()
        self._ids = itertools.count(1)
        self._models: dict[Path, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def env_ids() -> list[dict[str, Any]]:
        return [{"id": env_id, "max_turns": registry.spec(env_id).max_turns} for env_id in registry.env_ids()]

    @staticmethod
    def tasks(env_id: str, split: str) -> list[dict[str, Any]]:
        if env_id not in registry.env_ids():
            raise PlaygroundError(f"unknown environment {env_id!r}", 404)
        try:
            return [{"item_id": t.item_id, "category": t.category} for t in registry.tasks(env_id, split)]
        except UserError as error:
            raise PlaygroundError(str(error)) from None

    def start(self, env_id: str, item_id: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if env_id not in registry.env_ids():
            raise PlaygroundError(f"unknown environment {env_id!r}; registered: {', '.join(registry.env_ids())}")
        try:
            env = registry.make(env_id, **kwargs)
        except (TypeError, ValueError, UserError) as error:
            raise PlaygroundError(f"cannot make {env_id!r} with {kwargs}: {error}") from None
        try:
            observation, _ = env.reset(item_id=item_id)
        except (ValueError, UserError, EnvStateError) as error:
            env.close()
            raise PlaygroundError(f"cannot reset {env_id!r} to item {item_id!r}: {error}") from None
        with self._lock:
            session_id = next(self._ids)
            self._sessions[session_id] = _Session(env, item_id, observation)
            while len(self._sessions) > MAX_SESSIONS:
                _, oldest = self._sessions.popitem(last=False)
                oldest.env.close()
        return {"session": session_id, **self._state(self._sessions[session_id])}

    def step(self, session_id: int, reply: str) -> dict[str, Any]:
        session = self._session(session_id)
        with session.lock:
            return self._act(session, reply)

    def model_step(self, session_id: int, run_dir: Path) -> dict[str, Any]:
        """The run's newest checkpoint writes the next reply (greedy) and it is played."""
        session = self._session(session_id)
        generate = self._model(run_dir)
        with session.lock:
            if session.done:
                raise PlaygroundError("the episode is over; start a new one", 409)
            return self._act(session, generate(session.env, session.messages))

    def close(self, session_id: int) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            session.env.close()

    # ------------------------------------------------------------------ internals
    def _session(self, session_id: int) -> _Session:
        with self._lock:
            if session_id not in self._sessions:
                raise PlaygroundError(f"no playground session {session_id} (closed, or the oldest of "
                                      f"more than {MAX_SESSIONS})", 404)
            self._sessions.move_to_end(session_id)
            return self._sessions[session_id]

    def _act(self, session: _Session, reply: str) -> dict[str, Any]:
        if session.done:
            raise PlaygroundError("the episode is over; start a new one", 409)
        observation, reward, terminated, truncated, _ = session.env.step(reply)
        session.messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
        session.total_reward += reward
        session.done = terminated or truncated
        return {**self._state(session), "reward": reward, "terminated": terminated, "truncated": truncated}

    @staticmethod
    def _state(session: _Session) -> dict[str, Any]:
        env = session.env
        return {
            "item_id": session.item_id,
            "messages": session.messages,
            "done": session.done,
            "total_reward": session.total_reward,
            "available_actions": None if session.done else env.available_actions(),
            "image": grid_image(env),
            "screenshot": getattr(env.unwrapped, "last_screenshot", None),
        }

    def _model(self, run_dir: Path):
        """A function messages -> reply for the run's newest checkpoint."""
        with self._lock:
            if run_dir in self._models:
                return self._models[run_dir]
        try:
            folder = latest_model(run_dir)
            settings = played_settings(run_dir)
        except UserError as error:
            raise PlaygroundError(str(error)) from None
        from ..agent.chat import ChatEncoder
        from ..agent.generator import HFGenerator
        from ..agent.loading import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(folder)
        encoder = ChatEncoder(tokenizer)
        generator = HFGenerator(model, tokenizer.pad_token_id, [encoder.end_of_turn_id], temperature=0.0,
                                reuse_cache=False)
        rollout = settings.get("rollout") or {}
        max_new_tokens = int(rollout.get("max_new_tokens", 48))
        system_prompt = bool(rollout.get("system_prompt"))

        def generate(env: TextEnv, messages: list[dict[str, str]]) -> str:
            system = [{"role": "system", "content": env.instruction}] if system_prompt and env.instruction else []
            [generation] = generator.generate([encoder.start(system + messages)], max_new_tokens)
            return encoder.decode_reply(generation.ids)

        with self._lock:
            self._models[run_dir] = generate
        return generate
