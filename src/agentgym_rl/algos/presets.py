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
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Callable, Mapping

from . import advantages as _advantages  # noqa: F401  (fills ADVANTAGE)
from . import losses as _losses
from .masked import AGGREGATIONS
from .registry import ADVANTAGE, KL, LOSS, advantage_inputs, lookup


def setting(default: Any, doc: str, **bounds: float) -> Any:
    """A recipe field that is a hyper-parameter: a run's `algo` section may set it by the same
    name (`config.AlgoConfig` is generated from these), and each estimator or loss keyword of
    that name receives it. `doc` says what it does (the config's help); `bounds` (gt, ge, le)
    are checked for every recipe and every config."""
    unknown = set(bounds) - set(_BOUNDS)
    if unknown:
        raise TypeError(f"unknown bound(s) {', '.join(sorted(unknown))}; use {', '.join(_BOUNDS)}")
    return field(default=default, metadata={"doc": doc, "bounds": bounds})


_BOUNDS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    "gt": (lambda value, bound: value > bound, ">"),
    "ge": (lambda value, bound: value >= bound, ">="),
    "le": (lambda value, bound: value <= bound, "<="),
}


@dataclass(frozen=True)
class AlgorithmSpec:
    """One RL algorithm: which pieces it uses and their default hyper-parameters.

    The fields made with `setting` are the hyper-parameters, each declared only here (its
    default, bounds and description): a run's `algo` section overrides them by name, and every
    estimator (`advantage_kwargs`) and loss term (`algos.objective`) receives the ones its
    keywords name. The others say which pieces the recipe is made of.

    Attributes:
        name: the name users type (`--algo`, ``algo.name``).
        advantage: key of `ADVANTAGE`.
        summary: one line for help texts.
        needs_critic: trains a value head (then `value_loss` names its loss).
        kl_in_reward: True: −β·KL is folded into the per-token reward (reinforce++; the
            estimator receives the ``kl`` field and ``kl_coef``); False: β·KL is a loss term.
        policy_loss: key of `LOSS` for the policy.
        value_loss: key of `LOSS` for the critic, or None.
    """

    name: str
    advantage: str
    summary: str
    needs_critic: bool = False
    kl_in_reward: bool = False
    policy_loss: str = "ppo_clip"
    value_loss: str | None = None
    # -- hyper-parameters of the advantage
    normalize_std: bool = setting(False, "grpo, gigpo: divide by the group's standard deviation.")
    drop_threshold: float = setting(0.0, "loop: drop rollouts whose |advantage| is below this (0: keep all).", ge=0)
    gamma: float = setting(1.0, "Discount per action token (ppo's GAE, reinforce++), per turn (gigpo).", ge=0, le=1)
    lam: float = setting(1.0, "GAE's λ (ppo).", ge=0, le=1)
    step_weight: float = setting(1.0, "gigpo: weight ω of the step-level advantage (turns taken from the same "
                                      "environment state compared by their discounted return).", ge=0)
    whiten: bool = setting(False, "ppo: normalise the advantages over the batch's action tokens.")
    invalid_turn_penalty: float | None = setting(
        None, "null: every turn shares its trajectory's advantage A. A number p >= 0: a turn whose action the "
        "environment rejected gets min(A, 0) instead (such an action changed nothing, so a good outcome cannot "
        "credit it) from the token where its action first left every available action, and that token gets a "
        "further -p (`algos.discredit_turns`, `algos.penalize_tokens`).", ge=0)
    idle_turn_penalty: float | None = setting(
        None, "null: off. A number p >= 0: a turn whose action the environment accepted but that left it in a state "
        "the episode had already been in (`Trajectory.idle_turns`, by the environment's state keys: BabyAI's \"go to "
        "X\" with X reached already) gets min(A, 0) from the token its action begins at, and that token a further -p: "
        "as invalid_turn_penalty does for rejected turns. Asking for information changes no state either (BabyAI's "
        "\"check available actions\"): use it where observations already give what such actions would (the SmolLM2 "
        "recipes list the actions). Refused where no environment gives a state key (a mix: warned).",
        ge=0)
    rare_action_bonus: float | None = setting(
        None, "null: off. A number b > 0: an exploration bonus at the action level. The step's accepted actions "
        "that reached a new state are counted by kind (`Trajectory.action_verbs`: the environment's "
        "info[\"action_kind\"], BabyAI's \"go to\", \"pickup\", \"toggle\", else the action's first word); the first "
        "token of each action whose kind makes up at most rare_action_share of "
        "them gets +b on its advantage (`algos.rare_action_tokens`). A verb the policy seldom writes and no outcome "
        "has rewarded yet keeps being tried instead of losing its mass to the rewarded one (docs/RESULTS.md: "
        "SmolLM2's \"pickup\" on BabyAI).", ge=0)
    discovery_bonus: float | None = setting(
        None, "null: off. A number b > 0: an exploration bonus for what is seen anew. The first token of each "
        "accepted action that showed the agent part of the world it had not seen in the episode (the environment's "
        "info[\"discovered\"] > 0: BabyAI's unseen cells, on environments whose `EnvSpec` sets `discoveries`, not on "
        "AgentGym's own servers; refused where none reports it, a mix warned) gets +b on its advantage "
        "(`Trajectory.discovery_tokens`). Where the goal's object is out of view, the actions that look for it "
        "(turning, going through a door) earn it and naming the unseen object does not (docs/RESULTS.md: SmolLM2's "
        "refusals on BabyAI).", ge=0)
    rare_action_share: float = setting(
        0.05, "The largest share of the step's accepted actions a verb may hold and still earn rare_action_bonus.",
        gt=0, le=1)
    # -- hyper-parameters of the loss terms (`algos.objective`)
    clip_eps: float = setting(0.2, "PPO's clip range ε of the importance ratio.", gt=0)
    clip_eps_high: float | None = setting(
        None, "Upper clip range ε_high (\"clip-higher\", DAPO: e.g. 0.28 with ε = 0.2): a token whose advantage is "
        "positive may raise its ratio up to 1 + ε_high, so rare tokens that paid off can grow. null: ε.", gt=0)
    ratio_level: str = setting("token", "Importance ratio per \"token\", \"turn\" or \"trajectory\" (LOOP's "
                                        "ablation).")
    aggregation: str = setting("token-mean", "How token losses become one: token-mean, seq-mean-token-mean or "
                                             "seq-mean-token-sum.")
    tis_cap: float | None = setting(
        None, "Truncated importance sampling (`algos.truncated_is_weights`): weight each token's policy term by "
        "min(π_learner/π_generator, tis_cap), correcting for a generator that is not the learner (vLLM, bfloat16, "
        "another thread count; `rollout/logprob_gap_*` shows the gap). Needs recompute_old_logprobs. null: off; 2 is "
        "a common cap.", gt=0)
    kl_coef: float = setting(1e-3, "Weight β of the KL to the reference policy (0: no reference is kept).", ge=0)
    kl_estimator: str = setting("k3", "How the per-token KL to the reference is estimated: k1, k2 or k3 "
                                      "(Schulman's estimators).")
    value_coef: float = setting(0.5, "ppo: weight of the value loss.", ge=0)
    value_clip_eps: float | None = setting(0.2, "ppo: clip range ε_v of the value loss around the rollout-time "
                                                "values (a recipe's None: unclipped).", gt=0)
    entropy_coef: float = setting(0.0, "Weight of the entropy bonus (0: off).", ge=0)
    right_token_coef: float = setting(
        0.0, "Weight of `algos.right_token_loss`: at the token where a rejected reply left every available action, "
        "raise the total probability of the tokens that would have continued one (0: off; never at the action's "
        "first token, `envs.parsing.right_next_tokens`). Like invalid_turn_penalty, it needs the wrong tokens "
        "located.", ge=0)
    epochs: int = setting(1, "Passes over each batch of rollouts.", ge=1)

    def __post_init__(self) -> None:
        lookup(ADVANTAGE, self.advantage, "advantage estimator")
        lookup(KL, self.kl_estimator, "KL estimator")
        lookup(LOSS, self.policy_loss, "loss")
        for name in SPEC_FIELDS:
            value = getattr(self, name)
            for bound, limit in SETTING_BOUNDS[name].items():
                holds, sign = _BOUNDS[bound]
                if value is not None and not holds(value, limit):
                    raise ValueError(f"{self.name}: {name} must be {sign} {limit:g}, got {value!r}")
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

    def advantage_kwargs(self) -> dict[str, Any]:
        """Keyword hyper-parameters for ``ADVANTAGE[self.advantage]``: each keyword it
        declares that is a setting here, by name (`advantage_inputs`).

        Includes ``kl_coef`` only when the KL goes into the reward; the trainer then also
        passes the per-token ``kl`` field (estimated with `kl_estimator`).
        """
        kwargs = {name: getattr(self, name) for name in advantage_inputs(self.advantage)[2]
                  if name in SPEC_FIELDS and name != "kl_coef"}
        if self.kl_in_reward:
            kwargs["kl_coef"] = self.kl_coef
        return kwargs

    def settings_for(self, function: Callable) -> dict[str, Any]:
        """The keyword-only parameters of `function` that are settings here, with this recipe's
        values (ppo_clip: clip_eps, clip_eps_high, aggregation, ratio_level). A new
        hyper-parameter of a loss is a setting here with the same name."""
        return {name: getattr(self, name) for name in _setting_keywords(function)}

    def as_dict(self) -> dict[str, Any]:
        """All fields, e.g. to log the recipe a run used."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


SPEC_FIELDS = frozenset(f.name for f in fields(AlgorithmSpec) if "doc" in f.metadata)
"""The recipe's hyper-parameters (its `setting` fields): a run's `algo` section may override each."""

SETTING_DOCS: Mapping[str, str] = MappingProxyType(
    {f.name: f.metadata["doc"] for f in fields(AlgorithmSpec) if "doc" in f.metadata})
"""What each hyper-parameter does, in declaration order (the config's descriptions)."""

SETTING_BOUNDS: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {f.name: MappingProxyType(f.metadata["bounds"]) for f in fields(AlgorithmSpec) if "doc" in f.metadata})
"""Each hyper-parameter's bounds: gt, ge, le (`setting`)."""


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
                  needs_critic=True, gamma=1.0, lam=0.95, whiten=True, value_loss="value_clip"),
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
