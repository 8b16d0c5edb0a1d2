"""Pure-tensor RL algorithm pieces: advantages, policy/value/entropy losses, KL terms and
controllers, horizon schedules, and the algorithm recipes that combine them.

Depends only on torch and the standard library. Importing this package fills the
registries (`ADVANTAGE`, `LOSS`, `KL`, `SCHEDULE`) and `ALGORITHMS`.
"""

from .advantages import (
    add_at_tokens,
    broadcast_to_tokens,
    discredit_turns,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    loop_advantages,
    outcome_token_rewards,
    penalize_tokens,
    rare_action_tokens,
    rare_verbs,
    reinforce_pp_advantages,
    rloo_advantages,
    token_level_rewards,
)
from .kl import kl_k1, kl_k2, kl_k3, kl_loss, kl_penalty, kl_reward_penalty, kl_term
from .kl_control import KL_CONTROLLERS, AdaptiveKLController, FixedKLController, make_kl_controller
from .losses import (RATIO_LEVELS, entropy_loss, ppo_clip_loss, right_token_loss, token_entropy,
                     truncated_is_weights, unit_log_ratio, value_clip_loss)
from .masked import (
    AGGREGATIONS,
    aggregate_loss,
    masked_mean,
    masked_sum,
    masked_whiten,
    turn_ids_from_mask,
)
from .preference import dpo_loss, sequence_logprob
from .objective import OBJECTIVE_INPUTS, TERMS, Term, rl_objective
from .presets import (ALGORITHMS, SETTING_BOUNDS, SETTING_DOCS, SPEC_FIELDS, AlgorithmSpec, algorithm_names,
                      get_algorithm, setting)
from .registry import (
    ADVANTAGE,
    ADVANTAGE_FIELDS,
    KL,
    LOSS,
    SCHEDULE,
    AdvantageOutput,
    advantage_inputs,
    compute_advantages,
    lookup,
    register_advantage,
    register_kl,
    register_loss,
    register_schedule,
)
from .schedules import HorizonSchedule, fixed_schedule, from_config, stepwise_schedule

__all__ = [
    "ADVANTAGE", "ADVANTAGE_FIELDS", "AGGREGATIONS", "ALGORITHMS", "AdaptiveKLController",
    "AdvantageOutput", "AlgorithmSpec", "FixedKLController", "HorizonSchedule", "KL", "KL_CONTROLLERS",
    "LOSS", "OBJECTIVE_INPUTS", "RATIO_LEVELS", "SCHEDULE", "SETTING_BOUNDS", "SETTING_DOCS", "SPEC_FIELDS", "TERMS",
    "Term", "add_at_tokens", "advantage_inputs", "aggregate_loss", "algorithm_names",
    "broadcast_to_tokens", "compute_advantages", "discredit_turns", "entropy_loss", "fixed_schedule", "from_config",
    "gae_advantages", "get_algorithm", "gigpo_advantages", "grpo_advantages", "kl_k1", "kl_k2", "kl_k3", "kl_loss",
    "kl_penalty", "kl_reward_penalty", "kl_term", "lookup", "loop_advantages", "make_kl_controller",
    "masked_mean", "masked_sum", "masked_whiten", "outcome_token_rewards", "penalize_tokens", "ppo_clip_loss",
    "rare_action_tokens", "rare_verbs", "register_advantage", "register_kl", "register_loss", "register_schedule",
    "reinforce_pp_advantages", "right_token_loss", "rl_objective", "rloo_advantages", "setting", "stepwise_schedule",
    "token_entropy", "token_level_rewards", "truncated_is_weights", "turn_ids_from_mask", "unit_log_ratio",
    "value_clip_loss",
]
