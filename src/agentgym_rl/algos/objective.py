"""The RL objective: the loss terms of an algorithm's recipe, weighted and summed.

    loss = L_policy + value_coef · L_value + β · L_KL + right_token_coef · L_right
           + entropy_coef · L_entropy

Each `Term` says which `LOSS` function a recipe uses for it (none: the term is off) and the
weight it gets. The function receives its tensors by parameter name from the micro-batch's
inputs (`OBJECTIVE_INPUTS`) and its hyper-parameters by keyword from the recipe: a keyword
named like an `AlgorithmSpec` setting gets the recipe's value, as the advantage estimators
do (`AlgorithmSpec.advantage_kwargs`). So a new hyper-parameter is one `setting` of
`AlgorithmSpec` and a keyword of the function that reads it; a new term is one line in
`TERMS`, its loss registered with `register_loss`.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch import Tensor

from . import kl as _kl  # noqa: F401  (registers the "kl" loss term)
from .losses import truncated_is_weights
from .presets import SPEC_FIELDS, AlgorithmSpec
from .registry import LOSS, Metrics, lookup

OBJECTIVE_INPUTS = ("logprobs", "old_logprobs", "generator_logprobs", "advantages", "mask", "token_weights",
                    "values", "old_values", "returns", "ref_logprobs", "right_logprobs", "right_mask", "entropy",
                    "row_weights")
"""The tensors a loss term may take by parameter name, each (B, T) over B rows of T tokens
but `row_weights`, (B,):

    logprobs            log π_θ of the sampled tokens, with gradient
    old_logprobs        log π_old, the policy that sampled them (the learner's rescoring or
                        the generator's own), 0 off the mask
    generator_logprobs  the generator's own, kept when the learner rescored them (TIS)
    advantages          per-token advantages
    mask                1 on the policy's own tokens
    token_weights       weights of the policy terms; made here from the two logprobs above
                        when the recipe sets tis_cap (`truncated_is_weights`)
    values, old_values, returns    the critic's values (with gradient), its values at
                        rollout time, and the regression targets
    ref_logprobs        log π_ref of the KL term
    right_logprobs, right_mask     log total probability of the right continuations and
                        where they are (`right_token_loss`)
    entropy             per-token entropy of the policy, with gradient
    row_weights         each row's weight in a term that is a mean over rows, as the learner
                        weighs this micro-batch (`TokenBatch.row_weights`)
"""


@dataclass(frozen=True)
class Term:
    """One term of the objective.

    Attributes:
        loss: the key of `LOSS` a recipe uses for this term, or None when the term is off for it.
        weight: the term's weight for a recipe (0 keeps the term for its metrics only).
        logged_as: a metric name for the term's value (None: its function's own metrics say it).
    """

    loss: Callable[[AlgorithmSpec], str | None]
    weight: Callable[[AlgorithmSpec], float]
    logged_as: str | None = None


TERMS: tuple[Term, ...] = (
    Term(lambda spec: spec.policy_loss, lambda spec: 1.0),
    Term(lambda spec: spec.value_loss, lambda spec: spec.value_coef, "value_loss"),
    # With the KL in the reward (reinforce++) it is measured, not added: the advantages hold it.
    Term(lambda spec: "kl" if spec.kl_coef > 0 else None, lambda spec: 0.0 if spec.kl_in_reward else spec.kl_coef),
    Term(lambda spec: "right_token" if spec.right_token_coef > 0 else None, lambda spec: spec.right_token_coef,
         "right_token_loss"),
    Term(lambda spec: "entropy" if spec.entropy_coef > 0 else None, lambda spec: spec.entropy_coef),
)


@functools.lru_cache(maxsize=None)
def _parameters(function: Callable) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(required inputs, optional inputs, settings) of a loss function, read once per function."""
    params = inspect.signature(function).parameters.values()
    required = tuple(p.name for p in params if p.kind != p.KEYWORD_ONLY and p.default is p.empty)
    optional = tuple(p.name for p in params if p.name in OBJECTIVE_INPUTS and p.name not in required)
    settings = tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY and p.name in SPEC_FIELDS)
    return required, optional, settings


def _arguments(name: str, function: Callable, inputs: Mapping[str, Any], spec: AlgorithmSpec) -> dict[str, Any]:
    required, optional, settings = _parameters(function)
    missing = [p for p in required if inputs.get(p) is None]
    if missing:
        raise ValueError(f"loss term {name!r} needs input(s) {', '.join(map(repr, missing))}; given: "
                         f"{', '.join(k for k, v in inputs.items() if v is not None)}")
    arguments = {p: inputs[p] for p in required}
    arguments.update({p: inputs[p] for p in optional if inputs.get(p) is not None})
    arguments.update({p: getattr(spec, p) for p in settings})
    return arguments


def rl_objective(spec: AlgorithmSpec, inputs: Mapping[str, Tensor | None]) -> tuple[Tensor, Metrics]:
    """The loss of one micro-batch under `spec`'s recipe: its terms (`TERMS`), weighted and summed.

    Args:
        spec: the recipe, with the settings of the run (e.g. `config.AlgoConfig.spec()`); its
            kl_coef is the β in force (an adaptive controller's current value).
        inputs: tensors keyed by `OBJECTIVE_INPUTS` names; None counts as absent.

    Returns:
        (scalar loss with gradient, metrics): each term's own metrics, "value_loss" and
        "right_token_loss" for those terms, "tis_*" with truncated importance sampling.

    Raises:
        ValueError: an unknown input name, or an input a term of the recipe needs is absent.
    """
    unknown = sorted(set(inputs) - set(OBJECTIVE_INPUTS))
    if unknown:
        raise ValueError(f"unknown objective input(s) {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(OBJECTIVE_INPUTS)}")
    inputs = dict(inputs)
    metrics: Metrics = {}
    if spec.tis_cap is not None and inputs.get("generator_logprobs") is not None:
        inputs["token_weights"], tis_metrics = truncated_is_weights(
            inputs["old_logprobs"], inputs["generator_logprobs"], inputs["mask"], cap=spec.tis_cap)
        metrics.update(tis_metrics)
    total: Tensor | None = None
    for term in TERMS:
        name = term.loss(spec)
        if name is None:
            continue
        function = lookup(LOSS, name, "loss")
        value, term_metrics = function(**_arguments(name, function, inputs, spec))
        metrics.update(term_metrics)
        if term.logged_as:
            metrics[term.logged_as] = value.item()
        weight = term.weight(spec)
        if weight:
            total = weight * value if total is None else total + weight * value
    assert total is not None, "the policy term is always on"
    return total, metrics
