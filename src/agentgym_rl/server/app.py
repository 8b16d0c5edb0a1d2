"""An HTTP server for any registered environment: `agentgym-rl serve-env ENV`.

Our uniform API, the same for every environment (each body and response is a pydantic model,
so the OpenAPI schema at `/openapi.json` documents it):

    GET    /health                               {"status": "ok"}: alive (open without the token)
    GET    /v1/status                            {"env_id", "instances"}
    GET    /v1/info                              {"env_id", "instruction", "max_turns"}
    POST   /v1/envs                              {"id"}: a new instance
    POST   /v1/envs/{id}/reset      {item_id, seed}   {"observation", "info"}
    POST   /v1/envs/{id}/step       {action}          {"observation", "reward", "terminated", "truncated", "info"}
    GET    /v1/envs/{id}/available_actions            {"actions": [...] | null}
    GET    /v1/envs/{id}/expert_action                {"action": "..." | null}
    POST   /v1/envs/{id}/snapshot                     {"state": "..."}: the episode, signed
    POST   /v1/envs/{id}/restore    {state}           {"restored": id}
    DELETE /v1/envs/{id}                              {"closed": id}

and, for BabyAI, TextCraft and SciWorld, AgentGym's own endpoints (`/create`, `/reset`, `/step`, ...;
`agentgym.py`), on the same instances.

Errors are JSON `{"detail": ...}` with a status a client can act on: 401 without the bearer
token (when one is set, on every endpoint but /health), 404 for an unknown instance, 409 for a
call out of order (`step` before `reset`), 413 for a body over `max_body_bytes` (counted as it
arrives, chunked or not), 422 for a bad body or item id (quoting only an excerpt of it), 429
when `max_instances` are alive, 501 for a snapshot of an environment that cannot take one.
Calls on one instance run one at a time; instances idle for `idle_seconds` are closed when a
new one is created.

A snapshot (`TextEnv.snapshot`) is a pickle, which must never be read from an untrusted
source: the server signs each one it hands out (HMAC-SHA256 with a key of its own, or
`snapshot_key`, so that servers sharing the key accept each other's) and restores only what
carries its signature (`SnapshotSigner`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import itertools
import secrets
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from ..envs import registry
from ..http_guards import RequestGuard, Text, add_error_handlers
from ..envs.base import EnvStateError, TextEnv
from .agentgym import AGENTGYM_ENVS, add_agentgym_routes
from .errors import env_failed
from .offload import env_endpoint

MAX_ACTION_CHARS = 100_000
"""Longest action accepted (a model's reply can run long; 100 KB of it is already nonsense)."""


class ResetRequest(BaseModel):
    item_id: int | Text | None = None
    """Which task: an index or "<env>_<index>"; null picks one from `seed`."""
    seed: int | None = None


class StepRequest(BaseModel):
    action: Text = Field(max_length=MAX_ACTION_CHARS)
    """The agent's reply: plain text, or ReAct text holding one `Action:` line."""


class Created(BaseModel):
    id: int


class ResetResponse(BaseModel):
    observation: str
    info: dict[str, Any]


class StepResponse(BaseModel):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class Actions(BaseModel):
    actions: list[str] | None


class ExpertAction(BaseModel):
    action: str | None


class Snapshot(BaseModel):
    state: str = Field(max_length=10_000_000)
    """A snapshot this server (or one with its key) signed, as base64."""


class Info(BaseModel):
    env_id: str
    instruction: str
    max_turns: int


class Health(BaseModel):
    status: str


class Status(BaseModel):
    env_id: str
    instances: int


class SnapshotSigner:
    """Signs the snapshots a server hands out, and checks those it is asked to restore: a client
    can only restore a state a server with this key wrote, never a pickle of its own making."""

    def __init__(self, key: bytes | None = None):
        self.key = key or secrets.token_bytes(32)

    def sign(self, data: bytes) -> str:
        return base64.b64encode(hmac.new(self.key, data, hashlib.sha256).digest() + data).decode()

    def open(self, state: str) -> bytes:
        """The snapshot inside `state`; a ValueError unless this key signed it."""
        try:
            raw = base64.b64decode(state, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("not a snapshot: not base64") from None
        signature, data = raw[:32], raw[32:]
        if len(raw) < 32 or not hmac.compare_digest(signature, hmac.new(self.key, data, hashlib.sha256).digest()):
            raise ValueError("not a snapshot this server wrote (its signature does not match)")
        return data


@dataclass
class _Instance:
    env: TextEnv
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    last: dict[str, Any] | None = None
    """The last answer of AgentGym's endpoints (`agentgym.py`), which can be asked again."""


class _Instances:
    """The server's id → environment map, with a limit and idle expiry."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], max_instances: int, idle_seconds: float):
        self.make = registry.env_factory(env_id, env_kwargs)
        self.max_instances, self.idle_seconds = max_instances, idle_seconds
        self._by_id: dict[int, _Instance] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    def create(self) -> int:
        self._expire()
        with self._lock:
            if len(self._by_id) >= self.max_instances:
                raise HTTPException(429, f"{len(self._by_id)} instances are alive, the most this server keeps "
                                         "(--max-instances); close some first")
            new_id = next(self._ids)
            self._by_id[new_id] = _Instance(self.make())
        return new_id

    def get(self, instance_id: int) -> _Instance:
        instance = self._by_id.get(instance_id)
        if instance is None:
            raise HTTPException(404, f"no environment instance {instance_id} (closed, expired, or never created)")
        instance.last_used = time.monotonic()
        return instance

    def close(self, instance_id: int, missing_ok: bool = False) -> None:
        with self._lock:
            instance = self._by_id.pop(instance_id, None)
        if instance is None:
            if missing_ok:
                return
            raise HTTPException(404, f"no environment instance {instance_id}")
        with instance.lock:
            instance.env.close()

    def close_all(self) -> None:
        for instance_id in list(self._by_id):
            self.close(instance_id, missing_ok=True)

    def _expire(self) -> None:
        now = time.monotonic()
        idle = [i for i, inst in list(self._by_id.items()) if now - inst.last_used > self.idle_seconds]
        for instance_id in idle:
            self.close(instance_id, missing_ok=True)  # a client may have closed it meanwhile


def create_app(env_id: str, env_kwargs: dict[str, Any] | None = None, token: str | None = None,
               max_instances: int = 256, idle_seconds: float = 3600.0, max_body_bytes: int = 1_000_000,
               snapshot_key: bytes | None = None, allowed_hosts: Iterable[str] | None = None) -> FastAPI:
    """The FastAPI app serving `env_id` (a registered environment built with `env_kwargs`).

    Args:
        token: when set, every request must carry `Authorization: Bearer <token>`.
        max_instances: most environment instances alive at once.
        idle_seconds: an instance unused this long is closed when the next one is created.
        max_body_bytes: larger request bodies are refused with 413.
        snapshot_key: the key snapshots are signed with (None: a random one, so only this server
            restores its own).
        allowed_hosts: the names a request's `Host` may carry (`http_guards.host_names`); None: any.
    """
    signer = SnapshotSigner(snapshot_key)
    spec = registry.spec(env_id)
    instances = _Instances(env_id, dict(env_kwargs or {}), max_instances, idle_seconds)
    probe = instances.make()
    instruction = probe.instruction
    probe.close()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        instances.close_all()

    app = FastAPI(title=f"agentgym-rl {env_id} environment server", lifespan=lifespan)

    app.add_middleware(RequestGuard, token=token, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    add_error_handlers(app)
    env_call = env_endpoint(spec.pure_python)

    @app.get("/health")
    async def health() -> Health:
        return Health(status="ok")

    @app.get("/v1/status")
    async def status() -> Status:
        return Status(env_id=env_id, instances=len(instances))

    @app.get("/v1/info")
    async def info() -> Info:
        return Info(env_id=env_id, instruction=instruction, max_turns=spec.max_turns)

    @app.post("/v1/envs")
    @env_call
    def create() -> Created:
        return Created(id=instances.create())

    @app.post("/v1/envs/{instance_id}/reset")
    @env_call
    def reset(instance_id: int, body: ResetRequest) -> ResetResponse:
        instance = instances.get(instance_id)
        with instance.lock:
            try:
                observation, reset_info = instance.env.reset(body.item_id, seed=body.seed)
            except ValueError as error:  # a bad item id
                raise HTTPException(422, str(error)) from None
            except Exception as error:  # noqa: BLE001 — the environment broke: say how, keep serving
                raise env_failed(error) from None
        return ResetResponse(observation=observation, info=reset_info)

    @app.post("/v1/envs/{instance_id}/step")
    @env_call
    def step(instance_id: int, body: StepRequest) -> StepResponse:
        instance = instances.get(instance_id)
        with instance.lock:
            try:
                observation, reward, terminated, truncated, step_info = instance.env.step(body.action)
            except EnvStateError as error:
                raise HTTPException(409, str(error)) from None
            except Exception as error:  # noqa: BLE001
                raise env_failed(error) from None
        return StepResponse(observation=observation, reward=reward, terminated=terminated, truncated=truncated,
                            info=step_info)

    @app.get("/v1/envs/{instance_id}/available_actions")
    @env_call
    def available_actions(instance_id: int) -> Actions:
        instance = instances.get(instance_id)
        with instance.lock:
            return Actions(actions=instance.env.available_actions())

    @app.get("/v1/envs/{instance_id}/expert_action")
    @env_call
    def expert_action(instance_id: int) -> ExpertAction:
        instance = instances.get(instance_id)
        with instance.lock:
            return ExpertAction(action=instance.env.expert_action())

    @app.post("/v1/envs/{instance_id}/snapshot")
    @env_call
    def snapshot(instance_id: int) -> Snapshot:
        instance = instances.get(instance_id)
        with instance.lock:
            try:
                data = instance.env.snapshot()
            except NotImplementedError as error:
                raise HTTPException(501, str(error)) from None
            except EnvStateError as error:
                raise HTTPException(409, str(error)) from None
            except Exception as error:  # noqa: BLE001
                raise env_failed(error) from None
        return Snapshot(state=signer.sign(data))

    @app.post("/v1/envs/{instance_id}/restore")
    @env_call
    def restore(instance_id: int, body: Snapshot) -> dict[str, int]:
        instance = instances.get(instance_id)
        try:
            data = signer.open(body.state)
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        with instance.lock:
            try:
                instance.env.restore(data)
            except NotImplementedError as error:
                raise HTTPException(501, str(error)) from None
            except ValueError as error:  # signed by this key, but of another environment
                raise HTTPException(422, str(error)) from None
            except Exception as error:  # noqa: BLE001
                raise env_failed(error) from None
        return {"restored": instance_id}

    @app.delete("/v1/envs/{instance_id}")
    @env_call
    def close(instance_id: int) -> dict[str, int]:
        instances.close(instance_id)
        return {"closed": instance_id}

    if env_id in AGENTGYM_ENVS:
        add_agentgym_routes(app, env_id, instances, env_call)
    return app
