"""`HttpEnv`: an environment served over HTTP (`agentgym-rl serve-env`), itself a `TextEnv`.

The rollout engine, `check_env` and the experts use it exactly as an in-process environment.
The envs of one server share its `EnvServer` (pooled keep-alive connections); a call that could not reach the server is retried with backoff; an
instance the server no longer knows (it restarted) is created again at the next `reset`. A
step whose answer was lost is not retried (the environment may have taken it): it raises, and
the rollout engine records that episode as failed.
"""

from __future__ import annotations

import base64
import itertools
import os
import threading
import time
from typing import Any, Callable

import httpx

from .base import EnvStateError, StepResult, TextEnv


class RemoteEnvError(RuntimeError):
    """The server refused a call or could not be reached (the message says which and why)."""


class ServerConnection:
    """Pooled keep-alive connections to one server, with bounded retries of calls that could
    not reach it, and its refusals turned into exceptions.

    Args:
        url: the server, e.g. "http://127.0.0.1:8000".
        token: the server's bearer token, if it has one (default: $AGENTGYM_RL_ENV_TOKEN).
        timeout: seconds to wait for one answer.
        retries: further attempts of a call that could not reach the server.
        backoff: seconds before the first retry; doubled after each.
        probe_path: what `reachable` asks a server that could not be reached.
    """

    PROBE_EVERY = 2.0
    """Seconds between two probes of a server known to be down (`reachable`)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0, retries: int = 3,
                 backoff: float = 0.2, probe_path: str = "/health"):
        token = token if token is not None else os.environ.get("AGENTGYM_RL_ENV_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # As many keep-alive connections as a rollout may keep calls in flight (env_workers
        # threads, one call each), so that none is reopened per call.
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout, limits=limits)
        self.url = url.rstrip("/")
        self.retries, self.backoff, self.probe_path = retries, backoff, probe_path
        self.down = False  # a call could not reach it, and no probe has since
        self._probed = 0.0

    def call(self, method: str, path: str, body: dict | None = None, retry: bool = True,
             params: dict | None = None) -> Any:
        """The JSON answer of one call; retried while the server cannot be reached."""
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            try:
                response = self._http.request(method, path, json=body, params=params)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:  # nothing reached the server
                if attempt + 1 == attempts:
                    self._went_down()
                    raise RemoteEnvError(f"{self.url}: cannot connect ({error})") from None
                time.sleep(self.backoff * 2 ** attempt)
            except httpx.HTTPError as error:  # it stopped answering, or the connection broke
                self._went_down()
                raise RemoteEnvError(f"{self.url}{path}: {type(error).__name__} ({error})") from None
        self.down = False
        if response.status_code == 409:
            raise EnvStateError(response.json().get("detail", "out of order"))
        if response.status_code == 422 and path.endswith("/reset"):
            raise ValueError(str(response.json().get("detail")))
        if response.status_code >= 400:
            raise RemoteEnvError(f"{self.url}{path}: HTTP {response.status_code}: {response.text[:300]}")
        try:
            return response.json()
        except ValueError:
            raise RemoteEnvError(f"{self.url}{path}: not a JSON answer: {response.text[:200]!r}") from None

    def _went_down(self) -> None:
        self.down, self._probed = True, time.monotonic()

    def reachable(self) -> bool:
        """False while the server is known to be down; one that is is probed (`probe_path`) at
        most every `PROBE_EVERY` seconds, and is up again once it answers."""
        if not self.down:
            return True
        if time.monotonic() - self._probed < self.PROBE_EVERY:
            return False
        self._probed = time.monotonic()
        try:
            self.down = self._http.get(self.probe_path, timeout=5.0).status_code >= 500
        except httpx.HTTPError:
            self.down = True
        return not self.down

    def close(self) -> None:
        self._http.close()


def in_turn(servers: list[tuple[ServerConnection, Callable[[], TextEnv]]]) -> Callable[[], TextEnv]:
    """A factory of environments on `servers` ((connection, make) pairs) in turn, passing over a
    server known to be down (`ServerConnection.reachable`): with `rollout.episode_retries`, an
    episode a dead server took is played on the others. With all of them down, the next in turn
    (its episode fails and says why)."""
    turn, lock = itertools.count(), threading.Lock()

    def factory() -> TextEnv:
        with lock:
            start = next(turn)
            order = [servers[(start + k) % len(servers)] for k in range(len(servers))]
            make = next((make for server, make in order if server.reachable()), order[0][1])
        return make()

    factory.max_parallel = 0  # type: ignore[attr-defined]  (each server enforces its own limit)
    return factory


class EnvServer(ServerConnection):
    """An `agentgym-rl serve-env` server as clients see it: a `ServerConnection` and the
    server's `/v1/info`, read once. Every `HttpEnv` of a rollout on this server shares it, so
    an episode costs no new connection and no extra call."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0, retries: int = 3,
                 backoff: float = 0.2):
        super().__init__(url, token, timeout, retries, backoff)
        about = self.call("GET", "/v1/info")
        try:
            self.env_id, self.instruction, self.max_turns = about["env_id"], about["instruction"], about["max_turns"]
        except (KeyError, TypeError):
            self.close()
            raise RemoteEnvError(f"{self.url}/v1/info: not an environment server's answer "
                                 "(no env_id, instruction and max_turns)") from None


class HttpEnv(TextEnv):
    """A client of one environment instance on an `agentgym-rl serve-env` server.

    Args:
        server: the server's URL (this env then opens its own connections; `token`, `timeout`,
            `retries` and `backoff` are `EnvServer`'s), or an `EnvServer` shared with others.
    """

    def __init__(self, server: str | EnvServer, token: str | None = None, timeout: float = 60.0,
                 retries: int = 3, backoff: float = 0.2):
        self._owns_server = isinstance(server, str)
        self.server = EnvServer(server, token, timeout, retries, backoff) if isinstance(server, str) else server
        self._call = self.server.call
        self._id: int | None = None
        self.env_id, self.instruction, self.max_turns = self.server.env_id, self.server.instruction, \
            self.server.max_turns

    def _instance(self) -> str:
        if self._id is None:
            self._id = self._call("POST", "/v1/envs")["id"]
        return f"/v1/envs/{self._id}"

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        body = {"item_id": item_id, "seed": seed}
        try:
            answer = self._call("POST", f"{self._instance()}/reset", body)
        except RemoteEnvError as error:
            if "HTTP 404" not in str(error):
                raise
            self._id = None  # the server restarted (or expired the instance): start a new one
            answer = self._call("POST", f"{self._instance()}/reset", body)
        return answer["observation"], answer["info"]

    def step(self, action: str) -> StepResult:
        if self._id is None:
            raise EnvStateError("step before reset")
        answer = self._call("POST", f"{self._instance()}/step", {"action": action}, retry=False)
        try:
            result = (answer["observation"], float(answer["reward"]), answer["terminated"], answer["truncated"],
                      answer["info"])
        except (KeyError, TypeError, ValueError):
            raise RemoteEnvError(f"{self.server.url}: malformed step answer {str(answer)[:200]}") from None
        if not (isinstance(result[0], str) and isinstance(result[2], bool) and isinstance(result[3], bool)
                and isinstance(result[4], dict)):
            raise RemoteEnvError(f"{self.server.url}: malformed step answer {str(answer)[:200]}")
        return result

    def available_actions(self) -> list[str] | None:
        if self._id is None:
            return None
        return self._call("GET", f"{self._instance()}/available_actions")["actions"]

    def expert_action(self) -> str | None:
        if self._id is None:
            return None
        return self._call("GET", f"{self._instance()}/expert_action")["action"]

    def snapshot(self) -> bytes:
        """The server's signed snapshot (opaque here: only a server with its key restores it)."""
        if self._id is None:
            raise EnvStateError("call reset before snapshot")
        answer = self._snapshot_call("snapshot", None)
        return base64.b64decode(answer["state"])

    def restore(self, state: bytes) -> None:
        self._snapshot_call("restore", {"state": base64.b64encode(state).decode()})

    def _snapshot_call(self, what: str, body: dict | None) -> Any:
        try:
            return self._call("POST", f"{self._instance()}/{what}", body, retry=False)
        except RemoteEnvError as error:
            if "HTTP 501" in str(error):
                raise NotImplementedError(f"{self.server.url}: the environment cannot {what}") from None
            if "HTTP 422" in str(error):
                raise ValueError(f"{self.server.url}: {str(error).split(': ', 2)[-1]}") from None
            raise

    def close(self) -> None:
        """Close the server's instance (once), and the connections if this env opened them;
        never raises."""
        if self._id is not None:
            try:
                self._call("DELETE", f"/v1/envs/{self._id}", retry=False)
            except (RemoteEnvError, EnvStateError):
                pass
            self._id = None
        if self._owns_server:
            self.server.close()
