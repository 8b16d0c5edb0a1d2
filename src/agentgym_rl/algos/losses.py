"""Policy-gradient surrogate losses on (B, T) token tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import aggregate_loss, as_bool_mask, masked_mean
from .registry import Metrics, register_loss


@register_loss("ppo_clip")
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    aggregation: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Clipped surrogate objective (PPO, Schulman et al. 2017, eq. 7), as a loss.

    per_token = −min(ratio·A, clip(ratio, 1 − ε, 1 + ε_high)·A),
    ratio = exp(logprobs − old_logprobs).

    `clip_eps_high` decouples the upper bound ("clip-higher", DAPO, Yu et al. 2025) so
    low-probability tokens with positive advantage can still grow; None means ε.
    A token on the clipped branch has zero gradient: the update stops there.

    Args:
        logprobs: (B, T) log π_θ(token) under the current policy, with gradient.
        old_logprobs: (B, T) log π_old(token) from the policy that sampled the data.
        advantages: (B, T) per-token advantages (see `broadcast_to_tokens`).
        mask: (B, T) 0/1 or bool, 1 on tokens that enter the loss.
        clip_eps: lower clip range ε > 0.
        clip_eps_high: upper clip range ε_high > 0; defaults to `clip_eps`.
        aggregation: one of `masked.AGGREGATIONS`.

    Returns:
        loss: scalar with gradient; 0 (not NaN) when the mask is empty.
        metrics: "clip_fraction" (share of tokens on the clipped branch), "approx_kl"
            (mean of old − new logprob, the k1 estimate of KL(π_old‖π_θ)),
            "ratio_mean".
    """
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logprobs shape {tuple(shape)}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if clip_eps <= 0 or eps_high <= 0:
        raise ValueError(f"clip ranges must be positive, got clip_eps={clip_eps}, clip_eps_high={eps_high}")

    m = as_bool_mask(mask)
    # Padding may hold garbage (even ±inf); exp of it would give inf in the forward pass
    # and 0·inf = NaN in the backward pass, so zero those slots before any arithmetic.
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    adv = torch.where(m, advantages.detach(), torch.zeros_like(advantages))
    ratio = torch.exp(log_ratio)

    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    # max of the negated terms == −min of the objectives (the pessimistic bound).
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate_loss(per_token, m, aggregation)

    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((clipped > unclipped).to(ratio.dtype), m).item(),
            "approx_kl": masked_mean(-log_ratio, m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
        }
    return loss, metrics
