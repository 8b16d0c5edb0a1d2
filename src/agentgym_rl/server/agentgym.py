"""AgentGym's own endpoints beside our uniform API, so that AgentGym's env clients
(`agentenv.envs.BabyAIEnvClient`, `TextCraftEnvClient`, `SciworldEnvClient`) drive our servers
unchanged.

Each environment of AgentGym has its own field names; the layouts below are those its servers
answer and its clients read:

`GET /` says which environment is served, as AgentGym's servers do.

| env | POST /create | POST /reset {id, data_idx} | POST /step {id, action} | others |
|---|---|---|---|---|
| babyai | → {id} | → {observation, reward, score, done, deleted} | → {observation, reward, score, done} | GET /observation?id=, POST /close {id} |
| textcraft | {minecraft_dir, commands, goal} → {id, observation, done, reward} | → {id, observation, done, reward} | → {observation, reward, done} | GET /observation?id=, GET /detail?id=, POST /close {id} |
| sciworld | → {id} | → {task_name, var_num, task_description, observation, reward, score, deleted, done} | → {observation, reward, score, done} | GET /observation?id=, GET /detail?id=, POST /close {id} |

BabyAI's `score` is the episode's reward so far (AgentGym's BabyAI client trains on it);
SciWorld's is the simulator's score (-100..100, as AgentGym's server sends it and its client
trains on). SciWorld's `data_idx` indexes the same (task, variation) list as AgentGym's server
(`envs.sciworld.items`); its reset `observation` is the first `look around`, the task apart
in `task_description`. The visualiser's extras of AgentGym's SciWorld server (`/action_hint`,
`/goals`, `/object_tree`, `/state`) are not served. The observations are our environments'
own text. Mistakes get a 4xx status where AgentGym's
servers answered 200 with {"error": ...}, which their clients could not read either.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from ..envs.agentgym_remote import SERVER_NAMES
from ..envs.base import EnvStateError
from ..http_guards import Text
from .errors import env_failed

AGENTGYM_ENVS = ("babyai", "textcraft", "sciworld")
"""The environments whose AgentGym endpoints are served."""


class _Id(BaseModel):
    id: int


class _Reset(BaseModel):
    id: int
    data_idx: int = 0


class _Step(BaseModel):
    id: int
    action: Text = Field(max_length=100_000)


class _TextCraftCreate(BaseModel):
    minecraft_dir: Text | None = None
    """Where AgentGym's server reads recipes; ours has its own (ignored)."""
    commands: Text | None = None
    goal: Text | None = None


def add_agentgym_routes(app: FastAPI, env_id: str, instances: Any, env_call: Callable) -> None:
    """Add AgentGym's endpoints for `env_id` (one of `AGENTGYM_ENVS`) to `app`, on the same
    instances as the uniform API (`app`'s `_Instances`), each run as `env_call` (an
    `offload.env_endpoint`) runs it."""
    # Each instance keeps its last answer (`_Instance.last`) for /observation and /detail.

    def reset(instance_id: int, data_idx: int) -> dict[str, Any]:
        instance = instances.get(instance_id)
        with instance.lock:
            try:
                observation, info = instance.env.reset(data_idx)
            except ValueError as error:
                raise HTTPException(422, str(error)) from None
            except Exception as error:  # noqa: BLE001 — the environment broke: say how, keep serving
                raise env_failed(error) from None
            score = 0.0
            if env_id == "sciworld":  # AgentGym's keeps the task apart and reports the simulator's score
                observation = observation.removeprefix(info["task_description"] + "\n")
                score = info["score"]
            instance.last = {"observation": observation, "reward": 0.0, "score": score, "done": False, "info": info}
            return dict(instance.last)

    def step(instance_id: int, action: str) -> dict[str, Any]:
        instance = instances.get(instance_id)
        with instance.lock:
            if instance.last is None:
                raise HTTPException(409, f"environment {instance_id} was not reset")
            try:
                observation, reward, terminated, truncated, info = instance.env.step(action)
            except EnvStateError as error:
                raise HTTPException(409, str(error)) from None
            except Exception as error:  # noqa: BLE001
                raise env_failed(error) from None
            score = info["score"] if env_id == "sciworld" else instance.last["score"] + reward
            instance.last = {"observation": observation, "reward": reward, "score": score,
                             "done": terminated or truncated, "info": info}
            return dict(instance.last)

    def current(instance_id: int) -> dict[str, Any]:
        instance = instances.get(instance_id)
        if instance.last is None:
            raise HTTPException(409, f"environment {instance_id} was not reset")
        return dict(instance.last)

    @app.get("/", tags=["agentgym"])
    async def hello() -> str:
        return f"This is environment {SERVER_NAMES[env_id]}."

    @app.post("/close", tags=["agentgym"])
    @env_call
    def close(body: _Id) -> bool:
        try:
            instances.close(body.id)
        except HTTPException:
            return False
        return True

    if env_id == "babyai":
        @app.post("/create", tags=["agentgym"])
        @env_call
        def create() -> dict[str, int]:
            return {"id": instances.create()}

        @app.post("/reset", tags=["agentgym"])
        @env_call
        def babyai_reset(body: _Reset) -> dict[str, Any]:
            return {**_without_info(reset(body.id, body.data_idx)), "deleted": False}

        @app.post("/step", tags=["agentgym"])
        @env_call
        def babyai_step(body: _Step) -> dict[str, Any]:
            return _without_info(step(body.id, body.action))

        @app.get("/observation", tags=["agentgym"])
        @env_call
        def babyai_observation(id: int) -> dict[str, Any]:  # noqa: A002 — AgentGym's query name
            return {**_without_info(current(id)), "deleted": False}

    elif env_id == "textcraft":
        @app.post("/create", tags=["agentgym"])
        @env_call
        def textcraft_create(body: _TextCraftCreate | None = None) -> dict[str, Any]:
            if body is not None and (body.commands or body.goal):
                raise HTTPException(422, "custom crafting commands and goals are not served: reset to an item")
            instance_id = instances.create()
            answer = reset(instance_id, 0)
            return {"id": instance_id, "observation": answer["observation"], "done": False, "reward": 0}

        @app.post("/reset", tags=["agentgym"])
        @env_call
        def textcraft_reset(body: _Reset) -> dict[str, Any]:
            answer = reset(body.id, body.data_idx)
            return {"id": body.id, "observation": answer["observation"], "done": False, "reward": 0}

        @app.post("/step", tags=["agentgym"])
        @env_call
        def textcraft_step(body: _Step) -> dict[str, Any]:
            answer = step(body.id, body.action)
            return {"observation": answer["observation"], "reward": answer["reward"], "done": answer["done"]}

        @app.get("/observation", tags=["agentgym"])
        @env_call
        def textcraft_observation(id: int) -> str:  # noqa: A002
            return current(id)["observation"]

        @app.get("/detail", tags=["agentgym"])
        @env_call
        def textcraft_detail(id: int) -> dict[str, Any]:  # noqa: A002
            answer = current(id)
            return {"observation": answer["observation"], "done": answer["done"], "reward": answer["reward"],
                    "deleted": False}

    elif env_id == "sciworld":
        @app.post("/create", tags=["agentgym"])
        @env_call
        def sciworld_create() -> dict[str, int]:
            return {"id": instances.create()}

        @app.post("/reset", tags=["agentgym"])
        @env_call
        def sciworld_reset(body: _Reset) -> dict[str, Any]:
            return _sciworld_detail(reset(body.id, body.data_idx))

        @app.post("/step", tags=["agentgym"])
        @env_call
        def sciworld_step(body: _Step) -> dict[str, Any]:
            answer = step(body.id, body.action)
            return {key: answer[key] for key in ("observation", "reward", "score", "done")}

        @app.get("/observation", tags=["agentgym"])
        @env_call
        def sciworld_observation(id: int) -> str:  # noqa: A002
            return current(id)["observation"]

        @app.get("/detail", tags=["agentgym"])
        @env_call
        def sciworld_detail(id: int) -> dict[str, Any]:  # noqa: A002
            return _sciworld_detail(current(id))


def _without_info(answer: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in answer.items() if key != "info"}


def _sciworld_detail(answer: dict[str, Any]) -> dict[str, Any]:
    """AgentGym's SciWorld reset answer (also its /detail): the episode's task and last answer."""
    info = answer["info"]
    return {"task_name": info["task_name"], "var_num": info["variation"],
            "task_description": info.get("task_description", ""), "observation": answer["observation"],
            "reward": answer["reward"], "score": answer["score"], "deleted": False, "done": answer["done"]}
