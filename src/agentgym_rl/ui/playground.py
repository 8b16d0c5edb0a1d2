"""Environments played from the browser: by hand, or a run's newest checkpoint choosing the reply.

A session is an environment instance reset to one item plus the conversation so far. A run's
model sees that conversation as the rollouts of its run built it (the run's `rollout.system_prompt`
and `max_new_tokens`, greedy), re-encoded from text: with a byte-level tokenizer the same ids.
A model behind an OpenAI-compatible endpoint gets the environment's instruction as a system
message, then the conversation.

A request chooses only what cannot hurt the machine: an environment's safe arguments
(`EnvSpec.safe_kwargs`, bounded), and servers among those the viewer was started with
(`--allow-url`). The rest of an environment's arguments come from the viewer's command line
(`--env-arg ENV.KEY=VALUE`). What a remote server answers is logged, never sent back to the page.
"""

from __future__ import annotations

import base64
import io
import itertools
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

from ..envs import registry
from ..envs.base import EnvStateError, TextEnv
from ..envs.safe_kwargs import NotSettable
from ..errors import UserError
from ..http_guards import excerpt
from ..runs import latest_model, played_settings
from .index import within

MAX_ACTION_CHARS = 10_000
MAX_SESSIONS = 8
"""Sessions kept alive; starting one more closes the least recently used."""

log = logging.getLogger(__name__)


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
    def __init__(self, env: TextEnv, item_id: Any, observation: str, info: dict[str, Any], url: str | None):
        self.env = env
        self.item_id = item_id
        self.url = url
        """The env server it plays on; None: in the viewer."""
        self.info = info
        """The last reset's or step's info (the web env's screenshot is there)."""
        self.messages: list[dict[str, str]] = [{"role": "user", "content": observation}]
        self.done = False
        self.total_reward = 0.0
        self.lock = threading.Lock()


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of an http(s) URL (`agentgym+http` counts as http), else None."""
    parts = urlsplit(url.removeprefix("agentgym+"))
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port that is not a number
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port


class Playground:
    """Live sessions, and the models that have acted in them (one per run, loaded once).

    Args:
        allowed_urls: the servers (env servers, model APIs) a session may talk to, this
            machine's included: a URL's scheme, host and port must match one of them. The viewer
            fetches nothing else, so that a page cannot make it a proxy into the network or onto
            another service of this machine.
        env_settings: each environment's arguments given on the command line (env id -> kwargs),
            under those a request may set.
    """

    def __init__(self, allowed_urls: Iterable[str] = (), env_settings: dict[str, dict[str, Any]] | None = None) -> None:
        self.allowed = {origin for origin in map(_origin, allowed_urls) if origin is not None}
        self.env_settings = {env_id: dict(kwargs) for env_id, kwargs in (env_settings or {}).items()}
        self._sessions: OrderedDict[int, _Session] = OrderedDict()
        self._ids = itertools.count(1)
        self._models: dict[Path, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def env_ids() -> list[dict[str, Any]]:
        """Every registered environment, those that run as installed first (the page opens on the
        first): one that needs what only its user has (AppWorld's server and data) comes last.
        `settable`: the arguments a request may set."""
        specs = [registry.spec(env_id) for env_id in registry.env_ids()]
        return [{"id": spec.env_id, "max_turns": spec.max_turns, "requires": spec.requires,
                 "settable": sorted(spec.safe_kwargs)}
                for spec in sorted(specs, key=lambda spec: spec.requires is not None)]

    def tasks(self, env_id: str, split: str) -> list[dict[str, Any]]:
        if env_id not in registry.env_ids():
            raise PlaygroundError(f"unknown environment {excerpt(env_id)!r}", 404)
        try:
            tasks = registry.tasks(env_id, split, self.env_settings.get(env_id))
        except UserError as error:
            raise PlaygroundError(str(error)) from None
        return [{"item_id": t.item_id, "category": t.category} for t in tasks]

    def start(self, env_id: str, item_id: Any, kwargs: dict[str, Any], url: str | None = None) -> dict[str, Any]:
        """A session of `env_id` (in this process, or a client of the env server at `url`:
        `agentgym-rl serve-env`, or AgentGym's own as `agentgym+http://...`) reset to `item_id`."""
        if env_id not in registry.env_ids():
            raise PlaygroundError(f"unknown environment {excerpt(env_id)!r}; registered: "
                                  f"{', '.join(registry.env_ids())}")
        if url:
            self.check_url(url)
            if kwargs:
                raise PlaygroundError("an env server's environments take the arguments it was started with "
                                      "(`serve-env --env-arg`), not a request's")
        else:
            try:
                kwargs = registry.checked_kwargs(env_id, kwargs, lambda env: self.env_settings.get(env, {}))
            except NotSettable as error:
                raise PlaygroundError(f"{error} (`view --env-arg {env_id}.KEY=VALUE`)", 403) from None
            except ValueError as error:
                raise PlaygroundError(str(error)) from None
        try:
            env = registry.env_factory(env_id, kwargs, [url] if url else [], timeout=30.0)()
        except (TypeError, ValueError, UserError, OSError) as error:
            if url:  # what the server answered stays in the log
                log.warning("playground: %s at %s: %s", env_id, url, error)
                raise PlaygroundError(f"no environment server of {env_id!r} answered at {excerpt(url)} as expected "
                                      "(the viewer's log says why)") from None
            raise PlaygroundError(f"cannot make {env_id!r} with {excerpt(kwargs)}: {excerpt(str(error))}") from None
        try:
            observation, info = env.reset(item_id=item_id)
        except (ValueError, UserError, EnvStateError, OSError) as error:
            env.close()
            if url:
                log.warning("playground: reset %s to %r at %s: %s", env_id, item_id, url, error)
                raise PlaygroundError(f"the server at {excerpt(url)} could not reset {env_id!r} to item "
                                      f"{excerpt(item_id)!r} (the viewer's log says why)") from None
            raise PlaygroundError(f"cannot reset {env_id!r} to item {excerpt(item_id)!r}: {error}") from None
        with self._lock:
            session_id = next(self._ids)
            self._sessions[session_id] = _Session(env, item_id, observation, info, url)
            while len(self._sessions) > MAX_SESSIONS:
                _, oldest = self._sessions.popitem(last=False)
                oldest.env.close()
        return {"session": session_id, **self._state(self._sessions[session_id])}

    def step(self, session_id: int, reply: str) -> dict[str, Any]:
        session = self._session(session_id)
        with session.lock:
            return self._act(session, reply)

    def model_step(self, session_id: int, run_dir: Path | None = None, endpoint: str | None = None,
                   model_name: str = "") -> dict[str, Any]:
        """The next reply, greedy, from the run's newest checkpoint or from `model_name` at the
        OpenAI-compatible `endpoint` (its /chat/completions), played in the session."""
        session = self._session(session_id)
        policy, max_new_tokens, system_prompt, prefix = (self._run_policy(run_dir) if run_dir is not None
                                                         else self._endpoint_policy(endpoint, model_name))
        with session.lock:
            if session.done:
                raise PlaygroundError("the episode is over; start a new one", 409)
            env = session.env
            conversation = ([{"role": "system", "content": env.instruction}] if system_prompt and env.instruction
                            else []) + session.messages
            prompt = policy.encoder.start(conversation) if policy.encoder is not None else []
            if prefix:  # the reply continues from the run's `rollout.reply_prefix`, as in its rollouts
                prompt += policy.encoder.encode_text(prefix)
            try:
                [reply] = policy.act([env], [prompt], max_new_tokens, [conversation])
            except UserError as error:
                if run_dir is not None:
                    raise PlaygroundError(str(error), 502) from None
                log.warning("playground: the model at %s: %s", endpoint, error)
                raise PlaygroundError(f"the model at {excerpt(endpoint)} gave no reply (the viewer's log says why)",
                                      502) from None
            return self._act(session, prefix + reply.text)

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
        try:
            observation, reward, terminated, truncated, session.info = session.env.step(reply)
        except Exception as error:  # noqa: BLE001 — a remote env's transport, an env's own bug: shown, not a 500
            if session.url:
                log.warning("playground: step at %s: %s", session.url, error)
                raise PlaygroundError(f"the environment server at {excerpt(session.url)} failed on {excerpt(reply)!r} "
                                      "(the viewer's log says why)", 502) from None
            raise PlaygroundError(f"the environment failed on {excerpt(reply)!r}: {error}", 502) from None
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
            "screenshot": session.info.get("screenshot"),
        }

    def _run_policy(self, run_dir: Path) -> tuple[Any, int, bool, str]:
        """A greedy policy of the run's newest checkpoint (loaded once), with the reply length,
        system-prompt setting and reply prefix its rollouts used."""
        with self._lock:
            if run_dir in self._models:
                return self._models[run_dir]
        try:
            folder = latest_model(run_dir)
            rollout = played_settings(run_dir, log=lambda _: None).get("rollout") or {}
        except UserError as error:
            raise PlaygroundError(str(error)) from None
        if not within(folder, run_dir):
            raise PlaygroundError(f"the newest checkpoint of run {run_dir.name!r} links out of the run folder: "
                                  "not loaded")
        from ..config import RolloutConfig
        from ..rollout.backends import load_model, model_policy

        # Sessions take turns on one model: a KV cache kept from one session's turn is no
        # other session's prefix. Replies end where the run's ended (its stop strings).
        try:
            settings = RolloutConfig(reuse_kv_cache=False, stop_strings=list(rollout.get("stop_strings") or []))
            policy = model_policy(*load_model(folder), 0.0, settings)
        except (UserError, ValueError) as error:
            raise PlaygroundError(f"run {run_dir.name!r}: {error}") from None
        played = (policy, int(rollout.get("max_new_tokens", 48)), bool(rollout.get("system_prompt")),
                  str(rollout.get("reply_prefix") or ""))
        with self._lock:
            self._models[run_dir] = played
        return played

    def check_url(self, url: str) -> None:
        """Refuse a server the viewer was not started with (`allowed_urls`), on this machine too."""
        origin = _origin(url)
        if origin is None:
            raise PlaygroundError(f"not an http(s) URL: {excerpt(url)!r}")
        if origin not in self.allowed:
            raise PlaygroundError(f"the viewer talks only to servers given with --allow-url; {excerpt(url)!r} "
                                  "is not one", 403)

    def _endpoint_policy(self, endpoint: str | None, model_name: str) -> tuple[Any, int, bool, str]:
        if not endpoint or not endpoint.startswith(("http://", "https://")):
            raise PlaygroundError(f"a model endpoint is an http(s) URL ending in /v1, got {excerpt(endpoint)!r}")
        self.check_url(endpoint)
        from ..rollout.chat_api import ChatAPIPolicy

        return ChatAPIPolicy(endpoint, model_name, temperature=0.0, timeout=60.0), 256, True, ""
