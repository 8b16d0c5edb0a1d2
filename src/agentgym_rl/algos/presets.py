"""The RL algorithms a user can name (`agentgym-rl algos`), as recipes of algos pieces.

An algorithm is not an advantage estimator: it names one (ppo uses "gae") and adds
the policy/value losses, where the KL regulariser goes and the default
hyper-parameters of its paper. A trainer looks the recipe up with `get_algorithm` and
calls ``compute_advantages(spec.advantage, fields, **spec.advantage_kwargs())``.

| name        | advantage   | critic | KL                         | notable defaults                       |
|-------------|-------------|--------|----------------------------|----------------------------------------|
| gigpo       | gigpo       | no     | k3 loss, β = 1e-3          | γ = 0.95 per turn, ω = 1, std norm.    |
| grpo        | grpo        | no     | k3 loss, β = 1e-3          | group std normalisation                |
| loop        | loop        | no     | none                       | drop |A| < 0.01, ε = 0.1, 2 epochs,    |
|             |             |        |                            | per-rollout token mean                 |
| ppo         | gae         | yes    | k3 loss, β = 1e-3          | γ = 1, λ = 0.95, whitened advantages,  |
|             |             |        |                            | clipped value loss ε_v = 0.2           |
| reinforce++ | reinforce++ | no     | k1 in the reward, β = 1e-3 | global batch whitening                 |
| rloo        | rloo        | no     | k3 loss, β = 1e-3          | leave-one-out baseline                 |

Sources: β = 1e-3 with k3 as a loss, ε = 0.2 and one ratio per token are AgentGym-RL's
settings (Xi et al. 2025); LOOP's are from Chen et al. 2025 (K = 6 rollouts, no KL,
ε = 0.1, per-token clipping averaged per rollout then across rollouts, |A| < 0.01
dropped, 2 epochs); GiGPO's γ = 0.95 and ω = 1 are Feng et al. 2025's (verl-agent);
REINFORCE++ folds a k1 KL (sampling policy vs reference) into the per-token reward
(Hu et al. 2025, eq. 9). Values set in a run's config take precedence
over these defaults; that choice belongs to the trainer.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Callable, Mapping

from . import advantages as _advantages  # noqa: F401  (fills ADVANTAGE)
from . import losses as _losses
from .masked import AGGREGATIONS
from .registry import ADVANTAGE, KL, LOSS, advantage_inputs, lookup


@dataclass(frozen=True)
class AlgorithmSpec:
    """One RL algorithm: which pieces it uses and their default hyper-parameters.

    Attributes:
        name: the name users type (`--algo`, ``algo.name``).
        advantage: key of `ADVANTAGE`.
        summary: one line for help texts.
        needs_critic: trains a value head (then `value_loss` names its loss).
        normalize_std: grpo: divide by the group std.
        drop_threshold: loop: drop rollouts with |A| below this (0 = keep all).
        gamma: discount per action token (gae, reinforce++), per turn (gigpo).
        lam: GAE λ (gae).
        step_weight: gigpo: weight ω of the step-level advantage.
        whiten: gae: normalise advantages over the batch's action tokens.
        kl_coef: β of the KL-to-reference term; 0 means no reference model at all.
        kl_estimator: key of `KL` used to estimate the per-token KL.
        kl_in_reward: True: −β·KL is folded into the per-token reward (reinforce++; the
            estimator receives the ``kl`` field and ``kl_coef``); False: β·`kl_loss` is
            added to the loss.
        policy_loss: key of `LOSS` for the policy.
        ratio_level: importance-ratio level of the policy loss (`losses.RATIO_LEVELS`).
        clip_eps: PPO clip range ε.
        clip_eps_high: upper clip range ("clip-higher", DAPO); None: ε.
        aggregation: token → scalar loss reduction (`masked.AGGREGATIONS`).
        epochs: passes over each batch of rollouts.
        value_loss: key of `LOSS` for the critic, or None.
        value_clip_eps: ε of the clipped value loss (None: unclipped).
    """

    name: str
    advantage: str
    summary: str
    needs_critic: bool = False
    normalize_std: bool = False
    drop_threshold: float = 0.0
    gamma: float = 1.0
    lam: float = 1.0
    step_weight: float = 1.0
    whiten: bool = False
    kl_coef: float = 1e-3
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    policy_loss: str = "ppo_clip"
    ratio_level: str = "token"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    aggregation: str = "token-mean"
    epochs: int = 1
    value_loss: str | None = None
    value_clip_eps: float | None = None

    def __post_init__(self) -> None:
        lookup(ADVANTAGE, self.advantage, "advantage estimator")
        lookup(KL, self.kl_estimator, "KL estimator")
        lookup(LOSS, self.policy_loss, "loss")
        if self.ratio_level not in _losses.RATIO_LEVELS:
            raise ValueError(f"{self.name}: unknown ratio level {self.ratio_level!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"{self.name}: unknown aggregation {self.aggregation!r}")
        if self.needs_critic != (self.value_loss is not None):
            raise ValueError(f"{self.name}: a critic needs a value loss and only a critic has one")
        if self.value_loss is not None:
            lookup(LOSS, self.value_loss, "loss")
        if self.kl_in_reward and "kl" not in advantage_inputs(self.advantage)[1]:
            raise ValueError(f"{self.name}: estimator {self.advantage!r} takes no kl field for a KL-in-reward")
        if self.kl_coef < 0 or self.clip_eps <= 0 or self.epochs < 1 or self.drop_threshold < 0:
            raise ValueError(f"{self.name}: kl_coef >= 0, clip_eps > 0, epochs >= 1, drop_threshold >= 0")
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ValueError(f"{self.name}: clip_eps_high > 0 (or None: the same as clip_eps)")

    def advantage_kwargs(self) -> dict[str, Any]:
        """Keyword hyper-parameters for ``ADVANTAGE[self.advantage]``: each keyword it
        declares that is a field here, by name (`advantage_inputs`).

        Includes ``kl_coef`` only when the KL goes into the reward; the trainer then also
        passes the per-token ``kl`` field (estimated with `kl_estimator`).
        """
        kwargs = {name: getattr(self, name) for name in advantage_inputs(self.advantage)[2]
                  if name in SPEC_FIELDS and name != "kl_coef"}
        if self.kl_in_reward:
            kwargs["kl_coef"] = self.kl_coef
        return kwargs

    def policy_loss_kwargs(self) -> dict[str, Any]:
        """Keyword hyper-parameters for ``LOSS[self.policy_loss]``: each keyword it declares
        that is a field here, by name (ppo_clip: clip_eps, clip_eps_high, aggregation,
        ratio_level). A new hyper-parameter of the loss is a field here with the same name."""
        return _by_signature(LOSS[self.policy_loss], self)

    def as_dict(self) -> dict[str, Any]:
        """All fields, e.g. to log the recipe a run used."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


SPEC_FIELDS = frozenset(f.name for f in fields(AlgorithmSpec)) - {"name", "advantage", "summary"}
"""The fields of a recipe that are settings (a run's `algo` section may override those it declares)."""


def _by_signature(function: Callable, spec: AlgorithmSpec) -> dict[str, Any]:
    """The keyword-only parameters of `function` that are recipe fields, with the recipe's values."""
    return {name: getattr(spec, name) for name in _setting_keywords(function)}


@functools.lru_cache(maxsize=None)
def _setting_keywords(function: Callable) -> tuple[str, ...]:
    """Read once per function: the trainer asks for every micro-batch's loss."""
    return tuple(p.name for p in inspect.signature(function).parameters.values()
                 if p.kind == p.KEYWORD_ONLY and p.name in SPEC_FIELDS)


ALGORITHMS: Mapping[str, AlgorithmSpec] = MappingProxyType({spec.name: spec for spec in (
    AlgorithmSpec("gigpo", "gigpo", "GiGPO: GRPO plus step-level groups of turns from the same state "
                  "(Feng et al. 2025)", normalize_std=True, gamma=0.95),
    AlgorithmSpec("grpo", "grpo", "GRPO: group-normalised outcome advantages, no critic (Shao et al. 2024)",
                  normalize_std=True),
    AlgorithmSpec("loop", "loop", "LOOP: leave-one-out PPO, no critic, no KL (Chen et al. 2025)",
                  drop_threshold=0.01, kl_coef=0.0, clip_eps=0.1, aggregation="seq-mean-token-mean", epochs=2),
    AlgorithmSpec("ppo", "gae", "PPO with a value head and GAE over action tokens (Schulman et al. 2017)",
                  needs_critic=True, gamma=1.0, lam=0.95, whiten=True, value_loss="value_clip", value_clip_eps=0.2),
    AlgorithmSpec("reinforce++", "reinforce++", "REINFORCE++: KL-in-reward token returns, global whitening "
                  "(Hu et al. 2025)", kl_in_reward=True, kl_estimator="k1"),
    AlgorithmSpec("rloo", "rloo", "RLOO: leave-one-out baseline, no critic (Ahmadian et al. 2024)"),
)})


def get_algorithm(name: str) -> AlgorithmSpec:
    """`ALGORITHMS[name]`, or a ValueError listing the valid names."""
    return lookup(dict(ALGORITHMS), name, "algorithm")


def algorithm_names() -> list[str]:
    """Names of the RL algorithms, for the CLI (`agentgym-rl algos`, `algo.name`).

    These are the keys of `ALGORITHMS` (gigpo, grpo, loop, ppo, reinforce++, rloo), not of
    `ADVANTAGE`: an algorithm names its advantage estimator, and ppo's is "gae".
    """
    return sorted(ALGORITHMS)
