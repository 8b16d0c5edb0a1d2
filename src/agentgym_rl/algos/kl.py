"""Per-token KL estimators between the policy p = π_θ and a reference q = π_ref.

From J. Schulman, "Approximating KL Divergence" (2020). With tokens sampled from p and
log_ratio = log p − log q:

    k1 = log_ratio                         unbiased for KL(p‖q), high variance, can be < 0
    k2 = ½ · log_ratio²                    biased, low variance, ≥ 0; good when p ≈ q
    k3 = (q/p) − 1 − log(q/p)              unbiased (E_p[q/p] = 1), low variance, ≥ 0

GRPO (Shao et al. 2024, eq. 4) adds k3 to the loss as its KL regulariser.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .masked import as_bool_mask, masked_mean
from .registry import KL, Metrics, lookup, register_kl, register_loss

# A token whose policy/reference log-ratio exceeds 20 nats is a pathology (or padding
# with −inf logprobs) whose exp would overflow to inf and turn the loss into NaN.
# exp(20) ≈ 4.9e8 stays finite in fp32 and bf16 (not fp16: compute KL in fp32).
# Beyond the clamp the gradient is 0, which only affects such broken tokens.
K3_LOG_RATIO_CLAMP = 20.0


@register_kl("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = log p − log q. Shapes (B, T) → (B, T)."""
    return logprobs - ref_logprobs


@register_kl("k2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = ½ (log p − log q)². Shapes (B, T) → (B, T)."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@register_kl("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = q/p − 1 − log(q/p), with log(q/p) clamped to ±20. Shapes (B, T) → (B, T)."""
    log_q_over_p = torch.clamp(ref_logprobs - logprobs, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    # x − 1 − log x ≥ 0 for x > 0, so k3 is non-negative up to round-off.
    return torch.exp(log_q_over_p) - 1.0 - log_q_over_p


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate of KL(π_θ‖π_ref) on tokens sampled from π_θ.

    Args:
        logprobs: (B, T) log π_θ of the sampled tokens.
        ref_logprobs: (B, T) log π_ref of the same tokens.
        kind: a name in `KL` ("k1", "k2", "k3").

    Returns:
        (B, T) per-token estimates, differentiable w.r.t. `logprobs`.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"ref_logprobs shape {tuple(ref_logprobs.shape)} != logprobs shape {tuple(logprobs.shape)}")
    return lookup(KL, kind, "KL estimator")(logprobs, ref_logprobs)


def kl_loss(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kind: str = "k3") -> Tensor:
    """Masked token mean of the per-token KL (GRPO's KL term, Shao et al. 2024, eq. 3–4).

    The coefficient β is applied by the caller.

    Args:
        logprobs: (B, T) log π_θ of the sampled tokens, with gradient.
        ref_logprobs: (B, T) log π_ref of the same tokens (treated as constants).
        mask: (B, T) 0/1 or bool, 1 on tokens that enter the loss.
        kind: a name in `KL`.

    Returns:
        Scalar; 0 (with gradient) for an empty mask.
    """
    if mask.shape != logprobs.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logprobs shape {tuple(logprobs.shape)}")
    m = as_bool_mask(mask)
    # Zero both sides on masked slots so padding (possibly −inf) gives log-ratio 0,
    # keeping the forward and the backward pass finite.
    policy = torch.where(m, logprobs, torch.zeros_like(logprobs))
    ref = torch.where(m, ref_logprobs.detach(), torch.zeros_like(ref_logprobs))
    return masked_mean(kl_penalty(policy, ref, kind), m)


@register_loss("kl")
def kl_term(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, *,
            kl_estimator: str = "k3") -> tuple[Tensor, Metrics]:
    """`kl_loss` as a loss term of the objective (`algos.objective`): (loss, {"kl": its value})."""
    loss = kl_loss(logprobs, ref_logprobs, mask, kind=kl_estimator)
    return loss, {"kl": loss.item()}


def kl_reward_penalty(kl: Tensor, mask: Tensor, coef: float) -> Tensor:
    """The KL regulariser as a reward: −β · kl_t on action tokens, 0 elsewhere.

    The alternative to `kl_loss`: instead of adding β·KL to the loss, subtract it from
    the per-token reward before computing returns (InstructGPT, Ouyang et al. 2022,
    eq. 2; REINFORCE++, Hu et al. 2025, eq. 8). Estimate `kl` with the sampling policy,
    e.g. ``kl_penalty(old_logprobs, ref_logprobs, "k1")``; it is detached here, since a
    reward is a constant for the policy gradient.

    Args:
        kl: (B, T) per-token KL estimate.
        mask: (B, T) 0/1 or bool action mask.
        coef: β ≥ 0.

    Returns:
        (B, T) detached penalty rewards.
    """
    if coef < 0:
        raise ValueError(f"KL coefficient must be >= 0, got {coef}")
    if kl.shape != mask.shape:
        raise ValueError(f"kl shape {tuple(kl.shape)} != mask shape {tuple(mask.shape)}")
    kl = kl.detach()
    return torch.where(as_bool_mask(mask), -coef * kl, torch.zeros_like(kl))
