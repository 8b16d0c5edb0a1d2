"""Environments as Ray actors: `env.urls: ["ray:local"]` plays every episode's environment in
an actor of a Ray instance, through `RayEnv`, itself a `TextEnv`, so the rollout engine and
the trainers are unchanged.

Addresses (an `env.urls` entry):

- `ray:local`: a Ray instance started in this process (the default way to try it);
- `ray:auto`: the cluster this machine joined (`ray start --head` on one node,
  `ray start --address=HEAD:6379` on the others);
- `ray://HOST:10001`: a cluster through the Ray client.

`?cpus=0.25` sets the CPU share each actor reserves (0.25 by default: a whole CPU per actor
would leave a 2-core machine room for two environments and starve Ray's own tasks). A factory
keeps at most as many actors alive as the cluster's CPUs hold (`actor_budget`), over every
engine it serves together (a run's training and validation split it: `split_actor_budget`); one
more is refused at once rather than left waiting for room that never comes.
"""

from __future__ import annotations

import importlib
import signal
import threading
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from .base import EnvStateError, StepResult, TextEnv

DEFAULT_CPUS = 0.25
_INIT_LOCK = threading.Lock()


class RayEnvError(RuntimeError):
    """An actor did not answer in time or died: the episode ends as a recorded failure."""


CLOSE_TIMEOUT = 5.0
"""Seconds `RayEnv.close` waits for its environment to close before killing the actor."""


class _ActorBudget:
    """How many actors a factory may have alive at once; `take` refuses one more at once."""

    def __init__(self, capacity: int, what: str):
        self.capacity, self.what, self.alive = capacity, what, 0
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            if self.alive >= self.capacity:
                raise RayEnvError(f"the Ray cluster places {self.capacity} {self.what} actors and all are in use; "
                                  "fewer environments at once (rollout.max_envs) or a smaller ?cpus= share")
            self.alive += 1

    def give_back(self) -> None:
        with self._lock:
            self.alive -= 1


def split_actor_budget(budget: int, train_need: int, val_need: int) -> tuple[int, int]:
    """(training's, validation's) most environments alive at once when both share `budget`
    actors: validation gets what it needs up to half (at least 1), training the rest, so the two
    together never ask the cluster for more than it places, even when they play at once
    (`train.asynchronous`). `train_need` is what training would use (tasks × group size).

    Example: budget 8, validation of 90 items -> (4, 4); of 3 items -> (5, 3).

    Raises:
        ValueError: a budget of one actor cannot serve both.
    """
    if not val_need:
        return min(budget, train_need) or budget, 0
    if budget < 2:
        raise ValueError(f"the Ray cluster places {budget} actor, and training and validation need one each")
    val = min(val_need, max(1, budget // 2))
    return budget - val, val


class _EnvHost:
    """The actor: one environment built in the actor's process from its class's entry point
    ("module:Class") and constructor arguments."""

    def __init__(self, entry_point: str, kwargs: dict[str, Any]):
        module, _, name = entry_point.partition(":")
        self.env = getattr(importlib.import_module(module), name)(**kwargs)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.env, method)(*args)

    def ready(self) -> str:
        """The built environment's instruction (an instance's own, e.g. an MCP server's tool list)."""
        return self.env.instruction


def parse_address(url: str, default_cpus: float = DEFAULT_CPUS) -> tuple[str | None, float]:
    """(the address for `ray.init`, CPUs per actor) of a `ray:` URL (see the module docstring).

    Raises:
        ValueError: not one of the accepted forms, or a CPU share that is not positive.
    """
    parts = urlparse(url)
    query = parse_qs(parts.query)
    try:
        cpus = float(query.get("cpus", [default_cpus])[0])
    except ValueError:
        cpus = -1.0
    if cpus <= 0:
        raise ValueError(f"{url}: cpus must be a positive number, e.g. ?cpus=0.25")
    if parts.scheme == "ray" and parts.netloc:
        return f"ray://{parts.netloc}", cpus
    if parts.scheme == "ray" and parts.path in ("local", "auto"):
        return (None if parts.path == "local" else "auto"), cpus
    raise ValueError(f"{url!r} is not a Ray address: use ray:local, ray:auto or ray://HOST:PORT")


def actor_failure(error: Exception) -> str:
    """The last line of why an actor died (a `RayActorError`): the exception its constructor or
    method raised, when there was one."""
    cause = getattr(error, "error_msg", "") or str(error)
    last = [line for line in cause.splitlines() if line.strip()][-1:]
    return last[0] if last else cause


def connect(address: str | None) -> None:
    """Join the Ray instance at `address` (`parse_address`'s), or start one here for None; once
    per process."""
    import ray

    with _INIT_LOCK:
        if not ray.is_initialized():
            main = threading.current_thread() is threading.main_thread()
            on_sigterm = signal.getsignal(signal.SIGTERM) if main else None
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
            if main and callable(on_sigterm):
                # Ray's core replaces the handler with one that dumps a stack and kills the process;
                # the command's own ends it through its cleanup (env servers, then Ray's shutdown).
                signal.signal(signal.SIGTERM, on_sigterm)


def ray_factory(env_id: str, entry_point: str, kwargs: dict[str, Any], url: str, timeout: float,
                instruction: str = "", spec_limit: int = 0) -> Callable[[], TextEnv]:
    """A function making `RayEnv`s of `env_id` (its class `entry_point` built with `kwargs`) on
    the Ray instance of `url`; checked by making one now, so that an unreachable cluster or bad
    arguments fail before any work."""
    import ray

    address, cpus = parse_address(url)
    connect(address)
    host = ray.remote(num_cpus=cpus)(_EnvHost)
    capacity = max(1, int(ray.cluster_resources().get("CPU", 1) / cpus))
    budget = _ActorBudget(min(capacity, spec_limit) if spec_limit else capacity, f"{env_id} ({cpus:g} CPU)")

    def factory() -> TextEnv:
        budget.take()
        try:
            return RayEnv(host.remote(entry_point, kwargs), env_id, timeout, instruction, on_close=budget.give_back)
        except BaseException:
            budget.give_back()
            raise

    probe = factory()
    try:  # an actor whose environment could not be built dies at once: say why, before any work
        instruction = probe.wait_ready()  # the instance's own, for every environment made after
    finally:
        probe.close()
    factory.max_parallel = budget.capacity  # type: ignore[attr-defined]
    factory.actor_budget = budget.capacity  # type: ignore[attr-defined]  (shared by every engine it serves)
    return factory


class RayEnv(TextEnv):
    """A `TextEnv` whose environment lives in a Ray actor; every call waits at most `timeout`
    seconds. Errors the environment raises come back as themselves (an `EnvStateError` stays
    one); a dead or silent actor is a `RayEnvError`."""

    def __init__(self, actor: Any, env_id: str, timeout: float, instruction: str = "",
                 on_close: Callable[[], None] | None = None):
        self._actor = actor
        self.env_id = env_id
        self.instruction = instruction
        self.timeout = timeout
        self._on_close = on_close
        self._closed = False

    def _call(self, method: str, *args: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        if self._closed:
            raise EnvStateError("the environment was closed")
        try:
            return ray.get(self._actor.call.remote(method, *args), timeout=self.timeout)
        except RayTaskError as error:
            raise error.as_instanceof_cause() from None
        except GetTimeoutError:
            raise RayEnvError(f"{self.env_id} actor: {method} took longer than {self.timeout:g} s") from None
        except RayActorError as error:
            raise RayEnvError(f"{self.env_id} actor died: {str(error).splitlines()[0]}") from None

    def wait_ready(self) -> str:
        """Wait until the actor has built its environment; returns (and takes) that environment's
        instruction, which an instance may make itself.

        Raises:
            ValueError: building it failed (bad arguments); the message is the cause's.
        """
        import ray
        from ray.exceptions import RayActorError

        try:
            self.instruction = ray.get(self._actor.ready.remote(), timeout=self.timeout)
        except RayActorError as error:
            raise ValueError(f"the environment could not be built in its actor: {actor_failure(error)}") from None
        return self.instruction

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return self._call("reset", item_id, seed)

    def step(self, action: str) -> StepResult:
        return self._call("step", action)

    def available_actions(self) -> list[str] | None:
        return self._call("available_actions")

    def expert_action(self) -> str | None:
        return self._call("expert_action")

    def snapshot(self) -> bytes:
        return self._call("snapshot")

    def restore(self, state: bytes) -> None:
        self._call("restore", state)

    def close(self) -> None:
        if self._closed:
            return
        import ray

        self._closed = True
        try:
            ray.get(self._actor.call.remote("close"), timeout=min(self.timeout, CLOSE_TIMEOUT))
        except Exception:  # a dead (or never placed) actor has nothing left to close
            pass
        ray.kill(self._actor)
        if self._on_close is not None:
            self._on_close()
