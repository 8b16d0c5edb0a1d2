"""Name → function tables for the algorithm pieces, filled by `register_*` decorators.

Each table is a plain dict so the trainer, configs and CLI can look pieces up by the
string a user typed. Registration happens at import time of the defining module;
`agentgym_rl.algos` imports all of them, so importing the package fills every table.

Algorithms are not estimators: an *algorithm* (``agentgym-rl algos``: grpo, loop, ppo,
reinforce++, rloo) is a recipe in `presets.ALGORITHMS` that names its advantage
estimator (ppo uses "gae"), its losses and default hyper-parameters.

Advantage estimators — ``ADVANTAGE[name]``
-------------------------------------------
Calling convention, checked by `register_advantage` when a function is registered:

* Every parameter that is not keyword-only is a **batch field** and must be named from
  `ADVANTAGE_FIELDS` (the table below). A field the estimator cannot do without has no
  default; an optional one defaults to None.
* Every keyword-only parameter is a **hyper-parameter** and has a default.
* No ``*args`` / ``**kwargs``: an input the estimator does not use is an error (a
  ``TypeError`` from Python, a ``ValueError`` from `compute_advantages`), never
  silently ignored.
* The result is an `AdvantageOutput`: a real 2-tuple ``(advantages, metrics)`` — so
  ``adv, metrics = ADVANTAGE["grpo"](rewards, group_ids)`` keeps working — that also
  carries ``.returns`` ((B, T) value targets, or None) and ``.keep`` ((B,) bool rows
  the trainer should train on). ``advantages`` is (B,) for trajectory-level
  estimators (grpo, rloo, loop) and (B, T) for token-level ones (gae, reinforce++, gigpo);
  ``AdvantageOutput.token_advantages(mask)`` gives the (B, T) form in both cases.
  Outputs are detached.

Batch fields (B trajectories, T token positions):

    rewards        (B,)   float  outcome reward of each trajectory
    group_ids      (B,)   int    task id; samples of the same task share it
    mask           (B, T) 0/1    1 on the policy's own generated (action) tokens, 0 on
                                 prompt, environment-observation and padding tokens
    token_rewards  (B, T) float  per-token reward, on action tokens only
    values         (B, T) float  critic value V(s_t) at each token (read on action tokens)
    kl             (B, T) float  per-token KL estimate log π_old − log π_ref (or k2/k3)
                                 on action tokens, for a KL penalty folded into the reward
    state_ids      (B, T) int    id of the environment state each token's turn was taken
                                 from (`info["state_key"]`), -1 where there is none
    turn_rewards   (B, K) float  the reward of each of a trajectory's K turns (environment
                                 steps, in order; 0 past its own), summing to `rewards`

`advantage_inputs(name)` lists what an estimator takes; `compute_advantages(name,
fields, **hparams)` picks those fields out of a dict of batch tensors and calls it.

Other tables
------------
* ``LOSS[name]`` holds the terms of the RL objective (`algos.objective`), each ``-> (loss,
  metrics)`` with a scalar ``loss`` that carries gradient and is 0 (not NaN) on an empty
  mask. Their parameters follow the estimators' convention: tensors by name from
  `objective.OBJECTIVE_INPUTS`, hyper-parameters as keywords named like the recipe's
  settings. Policy losses ``(logprobs, old_logprobs, advantages, mask, *, ...)``
  ("ppo_clip"), the value loss ``(values, old_values, returns, mask, *, ...)``
  ("value_clip"), the KL term ``(logprobs, ref_logprobs, mask, *, kl_estimator)`` ("kl"),
  the right-token loss ``(right_logprobs, right_mask)`` ("right_token") and the entropy
  term ``(mask, *, logits=None, entropy=None, ...)`` ("entropy").
* ``KL[name](logprobs, ref_logprobs) -> per_token_kl`` of the same (B, T) shape.
* ``SCHEDULE[name](horizons, every) -> HorizonSchedule``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, TypeVar

import torch
from torch import Tensor

Metrics = dict[str, float]
AdvantageFn = Callable[..., "AdvantageOutput"]
LossFn = Callable[..., tuple[Tensor, Metrics]]
KLFn = Callable[[Tensor, Tensor], Tensor]

ADVANTAGE: dict[str, AdvantageFn] = {}
LOSS: dict[str, LossFn] = {}
KL: dict[str, KLFn] = {}
SCHEDULE: dict[str, Callable[..., Any]] = {}

ADVANTAGE_FIELDS = ("rewards", "group_ids", "mask", "token_rewards", "values", "kl", "state_ids", "turn_rewards")
"""Names a batch tensor may have when passed to an advantage estimator (see above)."""

F = TypeVar("F", bound=Callable[..., Any])


class AdvantageOutput(tuple):
    """What an advantage estimator returns: the 2-tuple ``(advantages, metrics)`` plus extras.

    It *is* a tuple of length 2 (unpacking, indexing and ``len`` behave as before), and
    it has named read-only attributes:

    Attributes:
        advantages: (B,) per-trajectory or (B, T) per-token advantages, detached; 0 on
            masked tokens in the (B, T) case.
        metrics: ``dict[str, float]`` for logging.
        returns: (B, T) regression targets for a value head (GAE: A + V) or the
            un-normalised returns (REINFORCE++); None for outcome-level estimators.
        keep: (B,) bool, False for rows the trainer should drop from the policy batch
            (LOOP's small-|A| filter); all True otherwise.
    """

    def __new__(cls, advantages: Tensor, metrics: Metrics, *, returns: Tensor | None = None,
                keep: Tensor | None = None) -> AdvantageOutput:
        if advantages.dim() not in (1, 2):
            raise ValueError(f"advantages must be (B,) or (B, T), got {tuple(advantages.shape)}")
        rows = advantages.shape[0]
        if keep is None:
            keep = torch.ones(rows, dtype=torch.bool, device=advantages.device)
        if keep.shape != (rows,) or keep.dtype != torch.bool:
            raise ValueError(f"keep must be a ({rows},) bool tensor, got {tuple(keep.shape)} {keep.dtype}")
        if returns is not None and (returns.dim() != 2 or returns.shape[0] != rows):
            raise ValueError(f"returns must be ({rows}, T), got {tuple(returns.shape)}")
        out = super().__new__(cls, (advantages, metrics))
        out.__dict__.update(_returns=returns, _keep=keep)
        return out

    def __getnewargs_ex__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:  # pickling / copy
        return (self[0], self[1]), {"returns": self._returns, "keep": self._keep}

    def __repr__(self) -> str:
        shape = tuple(self.advantages.shape)
        return f"AdvantageOutput(advantages={shape}, metrics={self.metrics}, keep={int(self.keep.sum())}/{len(self.keep)})"

    @property
    def advantages(self) -> Tensor:
        return self[0]

    @property
    def metrics(self) -> Metrics:
        return self[1]

    @property
    def returns(self) -> Tensor | None:
        return self._returns

    @property
    def keep(self) -> Tensor:
        return self._keep

    @property
    def level(self) -> str:
        """"trajectory" for (B,) advantages, "token" for (B, T)."""
        return "trajectory" if self.advantages.dim() == 1 else "token"

    def token_advantages(self, mask: Tensor) -> Tensor:
        """(B, T) advantages: a (B,) advantage spread over each row's action tokens, or
        the (B, T) advantages with masked tokens zeroed."""
        m = mask if mask.dtype == torch.bool else mask != 0
        if m.dim() != 2 or m.shape[0] != self.advantages.shape[0]:
            raise ValueError(f"mask must be (B, T) with B={self.advantages.shape[0]}, got {tuple(mask.shape)}")
        adv = self.advantages
        if adv.dim() == 1:
            adv = adv[:, None].expand(m.shape)
        elif adv.shape != m.shape:
            raise ValueError(f"mask shape {tuple(m.shape)} != advantages shape {tuple(adv.shape)}")
        return torch.where(m, adv, torch.zeros_like(adv))


def _register(table: dict[str, Any], what: str, name: str) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        # A silent overwrite would make the meaning of a config depend on import order.
        if name in table:
            raise ValueError(f"{what} {name!r} is already registered")
        table[name] = fn
        return fn

    return decorator


def _check_advantage_signature(name: str, fn: Callable[..., Any]) -> None:
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"advantage estimator {name!r}: *args/**kwargs would swallow inputs silently")
        if param.kind == param.KEYWORD_ONLY:
            if param.default is param.empty:
                raise TypeError(f"advantage estimator {name!r}: hyper-parameter {param.name!r} needs a default")
        elif param.name not in ADVANTAGE_FIELDS:
            raise TypeError(f"advantage estimator {name!r}: batch input {param.name!r} is not one of "
                            f"{', '.join(ADVANTAGE_FIELDS)} (hyper-parameters must be keyword-only)")
        elif param.default is not param.empty and param.default is not None:
            raise TypeError(f"advantage estimator {name!r}: optional batch input {param.name!r} must default to None")


def register_advantage(name: str) -> Callable[[F], F]:
    """Decorator: add an advantage estimator to `ADVANTAGE` under `name`.

    Raises:
        TypeError: if the function does not follow the convention in this module's
            docstring (batch inputs from `ADVANTAGE_FIELDS`, keyword-only hyper-parameters
            with defaults, no catch-all arguments).
    """
    register = _register(ADVANTAGE, "advantage estimator", name)

    def decorator(fn: F) -> F:
        _check_advantage_signature(name, fn)
        return register(fn)

    return decorator


def register_loss(name: str) -> Callable[[F], F]:
    """Decorator: add a loss term to `LOSS` under `name`."""
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


def advantage_inputs(name: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """What the estimator `name` takes: ``(required_fields, optional_fields, hyper_parameters)``.

    Example: ``advantage_inputs("reinforce++")`` is
    ``(("rewards", "mask"), ("kl",), ("kl_coef", "gamma", "eps"))``.
    """
    params = inspect.signature(lookup(ADVANTAGE, name, "advantage estimator")).parameters.values()
    required = tuple(p.name for p in params if p.kind != p.KEYWORD_ONLY and p.default is p.empty)
    optional = tuple(p.name for p in params if p.kind != p.KEYWORD_ONLY and p.default is not p.empty)
    hparams = tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY)
    return required, optional, hparams


def compute_advantages(name: str, fields: Mapping[str, Tensor | None], **hparams: Any) -> AdvantageOutput:
    """Call ``ADVANTAGE[name]`` with the batch fields it takes, picked out of `fields`.

    `fields` may hold more batch tensors than this estimator uses (a trainer can fill it
    once for any algorithm), but every key must be a known field name, so a typo such as
    "reward" fails loudly instead of being left out. Fields given as None count as absent.

    Args:
        name: a key of `ADVANTAGE`.
        fields: batch tensors keyed by names from `ADVANTAGE_FIELDS`.
        **hparams: hyper-parameters; each must be one the estimator declares.

    Returns:
        The estimator's `AdvantageOutput`.

    Raises:
        ValueError: unknown estimator, unknown field name, missing required field, or a
            hyper-parameter the estimator does not take.
    """
    fn = lookup(ADVANTAGE, name, "advantage estimator")
    unknown = sorted(set(fields) - set(ADVANTAGE_FIELDS))
    if unknown:
        raise ValueError(f"unknown batch field(s) {', '.join(map(repr, unknown))}; known: {', '.join(ADVANTAGE_FIELDS)}")
    required, optional, accepted = advantage_inputs(name)
    missing = [f for f in required if fields.get(f) is None]
    if missing:
        raise ValueError(f"advantage estimator {name!r} needs batch field(s) {', '.join(map(repr, missing))}")
    extra = sorted(set(hparams) - set(accepted))
    if extra:
        raise ValueError(f"advantage estimator {name!r} does not take {', '.join(map(repr, extra))}; "
                         f"its hyper-parameters: {', '.join(accepted) or 'none'}")
    inputs = {f: fields[f] for f in required + optional if fields.get(f) is not None}
    return fn(**inputs, **hparams)
