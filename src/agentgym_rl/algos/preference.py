"""Preference losses on per-sequence log-probabilities: DPO and conservative DPO.

For agents a "sequence" is a whole trajectory of one task: the log-probability of all the
model's replies given the observations it saw (the loss-mask tokens), as in trajectory-level
DPO for agents (ETO, Song et al. 2024). Chosen and rejected trajectories of one task share
the task but not the observations after the first turn; that is fine, since observation
tokens are masked out of both sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import metric_names as metric
from .masked import masked_sum
from .registry import Metrics, register_loss


def sequence_logprob(token_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Summed log-probability of the selected tokens of each sequence.

    log π(y | x) = Σ_t mask[t] · log π(y_t | y_<t, x).

    Args:
        token_logprobs: (B, T) per-token log-probabilities (e.g. `Learner.logprobs`); padded
            slots may hold anything, even ±inf or NaN.
        mask: (B, T) 0/1 or bool, 1 on the tokens the sequence is scored on (the loss mask).

    Returns:
        (B,) per-sequence sums; 0 for a sequence with an empty mask.
    """
    if token_logprobs.shape != mask.shape or token_logprobs.dim() != 2:
        raise ValueError(f"token_logprobs {tuple(token_logprobs.shape)} and mask {tuple(mask.shape)} "
                         "must both be (B, T)")
    return masked_sum(token_logprobs, mask, dim=-1)


@register_loss("dpo")
def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    reference_chosen: Tensor,
    reference_rejected: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Metrics]:
    """Direct Preference Optimization loss (Rafailov et al. 2023, eq. 7), with cDPO smoothing.

    With implicit rewards r_w = β·(log π_θ(y_w) − log π_ref(y_w)) and
    r_l = β·(log π_θ(y_l) − log π_ref(y_l)), and h = r_w − r_l:

        loss = mean over pairs of  −(1 − ε)·log σ(h) − ε·log σ(−h)

    ε = 0 is DPO. ε > 0 is conservative DPO (cDPO, Mitchell 2023): the preference label is
    taken to be flipped with probability ε, so the loss is minimised at a finite margin
    (h* = log((1 − ε)/ε)) instead of pushing the two sequences apart without bound.

    Unlike the token-level entries of `LOSS`, this takes (B,) per-sequence log-probabilities
    (see `sequence_logprob`); the reference ones are treated as constants.

    Args:
        policy_chosen: (B,) log π_θ(y_w | x), with gradient.
        policy_rejected: (B,) log π_θ(y_l | x), with gradient.
        reference_chosen: (B,) log π_ref(y_w | x).
        reference_rejected: (B,) log π_ref(y_l | x).
        beta: β > 0, the strength of the implicit KL constraint to the reference.
        label_smoothing: ε in [0, 0.5), the assumed rate of flipped labels.

    Returns:
        loss: scalar with gradient.
        metrics: "rewards/chosen" and "rewards/rejected" (mean r_w, r_l), "rewards/margin"
            (mean r_w − r_l), "rewards/accuracy" (share of pairs with r_w > r_l).
    """
    shape = policy_chosen.shape
    if len(shape) != 1:
        raise ValueError(f"expected (B,) per-sequence log-probabilities, got shape {tuple(shape)}")
    for name, t in (("policy_rejected", policy_rejected), ("reference_chosen", reference_chosen),
                    ("reference_rejected", reference_rejected)):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != policy_chosen shape {tuple(shape)}")
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        # At ε = 0.5 the label carries no information and the loss only pulls h to 0.
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")

    chosen_rewards = beta * (policy_chosen - reference_chosen.detach())
    rejected_rewards = beta * (policy_rejected - reference_rejected.detach())
    margin = chosen_rewards - rejected_rewards
    # logsigmoid rather than log(sigmoid(.)): stays finite for large |h|.
    per_pair = -(1.0 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)
    loss = per_pair.mean()

    with torch.no_grad():
        metrics = {
            metric.DPO_CHOSEN: chosen_rewards.mean().item(),
            metric.DPO_REJECTED: rejected_rewards.mean().item(),
            metric.DPO_MARGIN: margin.mean().item(),
            metric.DPO_ACCURACY: (margin > 0).float().mean().item(),
        }
    return loss, metrics
