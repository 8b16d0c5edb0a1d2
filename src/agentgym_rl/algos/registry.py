"""Name → function tables for the algorithm pieces, filled by `register_*` decorators.

Each table is a plain dict so the trainer, configs and CLI can look pieces up by the
string a user typed. Registration happens at import time of the defining module;
`agentgym_rl.algos` imports all of them, so importing the package fills every table.

Conventions (kept loose on purpose so GAE, REINFORCE++, RLOO, ... fit later):

* ``ADVANTAGE[name](...) -> (advantages, metrics)``: batch tensors come as arguments
  (GRPO needs rewards and group ids; GAE will need token rewards, values and a mask),
  hyper-parameters as keyword-only arguments; ``metrics`` is ``dict[str, float]``.
* ``LOSS[name](logprobs, old_logprobs, advantages, mask, **hparams) -> (loss, metrics)``
  with a scalar ``loss`` that carries gradient.
* ``KL[name](logprobs, ref_logprobs) -> per_token_kl`` of the same (B, T) shape.
* ``SCHEDULE[name](horizons, every) -> HorizonSchedule``.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from torch import Tensor

Metrics = dict[str, float]
AdvantageFn = Callable[..., tuple[Tensor, Metrics]]
LossFn = Callable[..., tuple[Tensor, Metrics]]
KLFn = Callable[[Tensor, Tensor], Tensor]

ADVANTAGE: dict[str, AdvantageFn] = {}
LOSS: dict[str, LossFn] = {}
KL: dict[str, KLFn] = {}
SCHEDULE: dict[str, Callable[..., Any]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def _register(table: dict[str, Any], what: str, name: str) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        # A silent overwrite would make the meaning of a config depend on import order.
        if name in table:
            raise ValueError(f"{what} {name!r} is already registered")
        table[name] = fn
        return fn

    return decorator


def register_advantage(name: str) -> Callable[[F], F]:
    """Decorator: add an advantage estimator to `ADVANTAGE` under `name`."""
    return _register(ADVANTAGE, "advantage estimator", name)


def register_loss(name: str) -> Callable[[F], F]:
    """Decorator: add a policy loss to `LOSS` under `name`."""
    return _register(LOSS, "loss", name)


def register_kl(name: str) -> Callable[[F], F]:
    """Decorator: add a per-token KL estimator to `KL` under `name`."""
    return _register(KL, "KL estimator", name)


def register_schedule(name: str) -> Callable[[F], F]:
    """Decorator: add a horizon-schedule builder to `SCHEDULE` under `name`."""
    return _register(SCHEDULE, "schedule", name)


def lookup(table: dict[str, Any], name: str, what: str) -> Any:
    """`table[name]`, or a ValueError that lists the valid names (for CLI/config errors).

    Args:
        table: one of the registries above.
        name: the name the user asked for.
        what: what the table holds, used in the message, e.g. "advantage estimator".
    """
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; registered: {', '.join(sorted(table))}") from None


def algorithm_names() -> list[str]:
    """Names of the RL algorithms, for the CLI (`--algo`).

    An algorithm is named by its advantage estimator ("grpo" now; "gae", "rloo",
    "reinforce++" later): they all share the clipped policy loss, so the estimator is
    what distinguishes them.
    """
    return sorted(ADVANTAGE)
