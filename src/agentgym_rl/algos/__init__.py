"""Pure-tensor RL algorithm pieces: advantages, policy losses, KL terms, schedules.

Depends only on torch and the standard library. Importing this package fills the
registries (`ADVANTAGE`, `LOSS`, `KL`, `SCHEDULE`).
"""

from .advantages import broadcast_to_tokens, grpo_advantages
from .kl import kl_k1, kl_k2, kl_k3, kl_loss, kl_penalty
from .losses import ppo_clip_loss
from .masked import AGGREGATIONS, aggregate_loss, masked_mean, masked_sum
from .registry import (
    ADVANTAGE,
    KL,
    LOSS,
    SCHEDULE,
    algorithm_names,
    lookup,
    register_advantage,
    register_kl,
    register_loss,
    register_schedule,
)
from .schedules import HorizonSchedule, fixed_schedule, from_config, stepwise_schedule

__all__ = [
    "ADVANTAGE", "AGGREGATIONS", "HorizonSchedule", "KL", "LOSS", "SCHEDULE",
    "aggregate_loss", "algorithm_names", "broadcast_to_tokens", "fixed_schedule",
    "from_config", "grpo_advantages", "kl_k1", "kl_k2", "kl_k3", "kl_loss", "kl_penalty",
    "lookup", "masked_mean", "masked_sum", "ppo_clip_loss", "register_advantage",
    "register_kl", "register_loss", "register_schedule", "stepwise_schedule",
]
