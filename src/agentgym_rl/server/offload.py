"""How an env server runs the endpoints that call an environment."""

from __future__ import annotations

import functools
from typing import Any, Callable

from fastapi.concurrency import run_in_threadpool


def env_endpoint(pure_python: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator making a plain function an async endpoint that runs it

    - on the event loop when the environment is `pure_python` (`EnvSpec`): it holds the GIL
      while it works, so threads could not overlap its instances anyway, and handing each call
      to a thread and back cost more server time than a BabyAI step (docs/BENCHMARKS.md);
    - else in a worker thread, so that instances overlap while they wait (on a JVM, a
      browser, the network) and a hung call holds up only its own instance.

    Either way it is one call where FastAPI would make two thread hops for a plain `def`
    endpoint (the endpoint, then its response check). The signature is kept, so FastAPI
    reads the parameters as before."""

    def decorate(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(endpoint)
        async def call(*args: Any, **kwargs: Any) -> Any:
            if pure_python:
                return endpoint(*args, **kwargs)
            return await run_in_threadpool(endpoint, *args, **kwargs)

        return call

    return decorate
