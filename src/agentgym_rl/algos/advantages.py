"""Advantage estimators: one scalar per trajectory, spread over its action tokens.

GRPO (Shao et al. 2024, "DeepSeekMath", §4.1.2, outcome supervision) replaces the
learned critic with a group baseline: sample several trajectories per task, and score
each by how much better its outcome reward is than its siblings'.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .registry import Metrics, register_advantage


def _check_rewards(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (B,), got {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(rewards.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


@register_advantage("grpo")
def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Metrics]:
    """Group-relative advantages (GRPO, Shao et al. 2024, eq. for Â_{i,t} in §4.1.2).

    adv_i = (r_i − mean_g) / (std_g + eps) for trajectory i in group g, where the group
    holds the trajectories sampled for the same task.

    The std is the *unbiased* (n − 1) sample std, as `torch.std` computes it in the
    DeepSeekMath-style reference implementations; with the small groups used in
    practice (4–16) it gives slightly smaller advantages than the population std.
    `normalize_std=False` keeps only the mean baseline (Dr. GRPO, Liu et al. 2025).

    Groups whose rewards are all equal, including groups of one trajectory, carry no
    learning signal and get advantage exactly 0. That is checked with max == min, not
    via the std, so float round-off in the mean cannot leak a tiny non-zero value.

    Args:
        rewards: (B,) float outcome reward, one per trajectory.
        group_ids: (B,) integer group (task) id per trajectory; ids need not be
            contiguous or sorted.
        normalize_std: divide by the group std (GRPO) or only subtract the mean.
        eps: added to the std so a near-constant group cannot blow up.

    Returns:
        advantages: (B,) detached, same dtype as `rewards`.
        metrics: "num_groups", "zero_var_group_frac" (groups with no signal),
            "adv_abs_mean", "reward_mean".
    """
    _check_rewards(rewards, group_ids)
    rewards = rewards.detach()
    if rewards.numel() == 0:
        return rewards.clone(), {"num_groups": 0.0, "zero_var_group_frac": 0.0, "adv_abs_mean": 0.0, "reward_mean": 0.0}

    # Map arbitrary ids to 0..G-1 so per-group statistics are dense scatter targets.
    _, index = torch.unique(group_ids, return_inverse=True)
    num_groups = int(index.max()) + 1
    zeros = rewards.new_zeros(num_groups)
    count = zeros.index_add(0, index, torch.ones_like(rewards))
    mean = zeros.index_add(0, index, rewards) / count
    centered = rewards - mean[index]

    g_max = zeros.scatter_reduce(0, index, rewards, reduce="amax", include_self=False)
    g_min = zeros.scatter_reduce(0, index, rewards, reduce="amin", include_self=False)
    constant = g_max == g_min  # (G,) also true for groups of size 1

    if normalize_std:
        # Unbiased variance; clamp(n−1, 1) only matters for size-1 groups, zeroed below.
        var = zeros.index_add(0, index, centered**2) / (count - 1).clamp(min=1)
        adv = centered / (var.sqrt()[index] + eps)
    else:
        adv = centered
    adv = torch.where(constant[index], torch.zeros_like(adv), adv)

    metrics = {
        "num_groups": float(num_groups),
        "zero_var_group_frac": constant.float().mean().item(),
        "adv_abs_mean": adv.abs().mean().item(),
        "reward_mean": rewards.mean().item(),
    }
    return adv, metrics


def broadcast_to_tokens(adv: Tensor, loss_mask: Tensor) -> Tensor:
    """Give every action token its trajectory's advantage; 0 on masked tokens.

    Outcome-reward methods assign one advantage per trajectory; environment
    observation tokens and padding are masked out so they receive no credit.

    Args:
        adv: (B,) per-trajectory advantages.
        loss_mask: (B, T) 0/1 or bool, 1 on the policy's own (action) tokens.

    Returns:
        (B, T) advantages, dtype of `adv`.
    """
    if adv.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != adv.shape[0]:
        raise ValueError(f"expected adv (B,) and loss_mask (B, T), got {tuple(adv.shape)} and {tuple(loss_mask.shape)}")
    return adv[:, None] * loss_mask.to(adv.dtype)
