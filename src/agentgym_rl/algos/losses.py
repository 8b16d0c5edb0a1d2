"""Loss terms on (B, T) token tensors: the PPO clipped policy loss (with per-token,
per-turn or per-trajectory importance ratios), the clipped value loss and the entropy
term. Each returns ``(scalar loss with gradient, metrics)`` and is 0, not NaN, when
the mask selects nothing. Also the truncated importance weights that correct the policy
loss for a generator other than the learner.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .masked import aggregate_loss, as_bool_mask, masked_mean, masked_sum, turn_ids_from_mask
from .registry import Metrics, register_loss

RATIO_LEVELS = ("token", "turn", "trajectory")

# A turn's or trajectory's log-ratio is a sum over up to thousands of tokens and can
# reach values whose exp overflows; clamped to ±20 nats (ratio e^±20) before the exp.
# Such a unit is far outside any clip range, so the clamp only changes the forward
# value of tokens the PPO bound already treats as clipped (or unboundedly bad).
UNIT_LOG_RATIO_CLAMP = 20.0


def _check_turn_ids(turn_ids: Tensor, mask: Tensor) -> None:
    if turn_ids.shape != mask.shape:
        raise ValueError(f"turn_ids shape {tuple(turn_ids.shape)} != mask shape {tuple(mask.shape)}")
    if turn_ids.dtype.is_floating_point or turn_ids.dtype == torch.bool:
        raise ValueError(f"turn_ids must be an integer tensor, got {turn_ids.dtype}")
    if bool((turn_ids[mask] < 0).any()):
        raise ValueError("turn_ids must be >= 0 on every action (mask-1) token")


def unit_log_ratio(log_ratio: Tensor, mask: Tensor, level: str, turn_ids: Tensor | None = None) -> Tensor:
    """Sum of the token log-ratios over each token's unit, written back on every token.

    The unit of an action token is itself ("token"), its turn ("turn": the action
    tokens sharing its turn id in the row) or its whole row ("trajectory"). So
    exp(unit_log_ratio) is the importance ratio π_θ(unit)/π_old(unit) of the unit as
    one action — the product of its token ratios.

    Args:
        log_ratio: (B, T) log π_θ − log π_old per token (treated as a constant here).
        mask: (B, T) 0/1 or bool action mask.
        level: one of `RATIO_LEVELS`.
        turn_ids: (B, T) integer turn index per token, ≥ 0 on action tokens, −1 (or
            anything) elsewhere; ids only need to be distinct between turns of the same
            row. None with level "turn" derives them from the mask (each maximal run of
            action tokens is a turn, `masked.turn_ids_from_mask`).

    Returns:
        (B, T) detached, 0 on mask-0 tokens.
    """
    m = as_bool_mask(mask)
    log_ratio = torch.where(m, log_ratio.detach(), torch.zeros_like(log_ratio))
    if level == "token":
        return log_ratio
    if level == "trajectory":
        total = masked_sum(log_ratio, m, dim=-1)[:, None].expand_as(log_ratio)
        return torch.where(m, total, torch.zeros_like(log_ratio))
    if level != "turn":
        raise ValueError(f"unknown ratio level {level!r}; choose one of {', '.join(RATIO_LEVELS)}")
    turn_ids = turn_ids_from_mask(m) if turn_ids is None else turn_ids
    _check_turn_ids(turn_ids, m)
    out = torch.zeros_like(log_ratio)
    if not bool(m.any()):
        return out
    ids = turn_ids.long()
    rows = torch.arange(m.shape[0], device=m.device)[:, None].expand_as(ids)
    key = (rows * (int(ids[m].max()) + 1) + ids)[m]  # one key per (row, turn)
    _, inverse = torch.unique(key, return_inverse=True)
    sums = log_ratio.new_zeros(int(inverse.max()) + 1).index_add(0, inverse, log_ratio[m])
    out[m] = sums[inverse]
    return out


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
    ratio_level: str = "token",
    turn_ids: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Clipped surrogate objective (PPO, Schulman et al. 2017, eq. 7), as a loss.

    per_token = −min(ρ_t·A_t, clip(ρ_t, 1 − ε, 1 + ε_high)·A_t) · w_t,

    with w_t = 1 unless `token_weights` are given (e.g. `truncated_is_weights`).

    `clip_eps_high` decouples the upper bound ("clip-higher", DAPO, Yu et al. 2025) so
    low-probability tokens with positive advantage can still grow; None means ε.
    A token on the clipped branch has zero gradient: the update stops there.

    Importance-ratio level (the per-token / per-turn / per-trajectory ablation of LOOP,
    Chen et al. 2025, §4, where per-token was best):

    * "token": ρ_t = π_θ(y_t)/π_old(y_t), the usual PPO-for-LLMs ratio.
    * "turn": every token of a turn uses the turn's ratio ρ_u = Π_{s∈turn} π_θ(y_s)/π_old(y_s)
      = exp(Σ_s log-ratio_s) — the exact likelihood ratio of the turn as one action
      (product, not the length-normalised geometric mean of GSPO). The clip decision
      is thus made per turn.
    * "trajectory": the same with the unit being all action tokens of the row.

    For the unit levels the ratio is built as ρ̃_t = exp(lr_t − sg(lr_t) + sg(L_u))
    (sg = stop-gradient, L_u = unit log-ratio, clamped to ±20): its value is ρ_u for
    every token of the unit and dρ̃_t/dlr_t = ρ_u. Hence, for an advantage constant
    within the unit, the per-token terms of a unit sum (aggregation
    "seq-mean-token-sum") to exactly the gradient of the unit-level objective
    −min(ρ_u·A, clip(ρ_u)·A); under the mean aggregations each token carries weight
    1/N as at the token level. The level changes only the importance weight and the
    trust-region test, not how tokens are weighted, so levels compare at equal
    learning rates. The levels coincide when each turn is one token (turn = token) or
    a row has a single turn (turn = trajectory). Per-token advantages (GAE) are kept.

    Args:
        logprobs: (B, T) log π_θ(token) under the current policy, with gradient.
        old_logprobs: (B, T) log π_old(token) from the policy that sampled the data.
        advantages: (B, T) per-token advantages (see `broadcast_to_tokens`).
        mask: (B, T) 0/1 or bool, 1 on tokens that enter the loss.
        clip_eps: lower clip range ε > 0.
        clip_eps_high: upper clip range ε_high > 0; defaults to `clip_eps`.
        aggregation: one of `masked.AGGREGATIONS`.
        ratio_level: one of `RATIO_LEVELS`.
        turn_ids: (B, T) integer turn index (≥ 0 on action tokens, −1 elsewhere), only
            with ratio_level "turn"; None derives turns from the mask (maximal runs of
            action tokens).
        token_weights: (B, T) constant weights w_t of the tokens' terms (None: 1).

    Returns:
        loss: scalar with gradient; 0 (not NaN) when the mask is empty.
        metrics: "clip_fraction" (share of tokens on the clipped branch), "approx_kl"
            (mean of old − new logprob, the k1 estimate of KL(π_old‖π_θ)),
            "ratio_mean" (mean over tokens of the ratio each token used).
    """
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logprobs shape {tuple(shape)}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if clip_eps <= 0 or eps_high <= 0:
        raise ValueError(f"clip ranges must be positive, got clip_eps={clip_eps}, clip_eps_high={eps_high}")
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {ratio_level!r}; choose one of {', '.join(RATIO_LEVELS)}")
    if turn_ids is not None and ratio_level != "turn":
        raise ValueError(f"turn_ids only apply to ratio_level 'turn', not {ratio_level!r}")

    m = as_bool_mask(mask)
    # Padding may hold garbage (even ±inf); exp of it would give inf in the forward pass
    # and 0·inf = NaN in the backward pass, so zero those slots before any arithmetic.
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    adv = torch.where(m, advantages.detach(), torch.zeros_like(advantages))
    if ratio_level == "token":
        ratio = torch.exp(log_ratio)
    else:
        unit = unit_log_ratio(log_ratio, m, ratio_level, turn_ids)
        unit = unit.clamp(-UNIT_LOG_RATIO_CLAMP, UNIT_LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio - log_ratio.detach() + unit)

    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    # max of the negated terms == −min of the objectives (the pessimistic bound).
    per_token = torch.maximum(unclipped, clipped)
    if token_weights is not None:
        if token_weights.shape != shape:
            raise ValueError(f"token_weights shape {tuple(token_weights.shape)} != logprobs shape {tuple(shape)}")
        per_token = per_token * torch.where(m, token_weights.detach(), torch.zeros_like(token_weights))
    loss = aggregate_loss(per_token, m, aggregation)

    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((clipped > unclipped).to(ratio.dtype), m).item(),
            "approx_kl": masked_mean(-log_ratio, m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
        }
    return loss, metrics


def truncated_is_weights(old_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor, *,
                         cap: float) -> tuple[Tensor, Metrics]:
    """Truncated importance-sampling weights for tokens sampled by a generator that is not
    the learner (another engine such as vLLM, another precision or thread count):

        w_t = min(π_old(y_t) / π_gen(y_t), C) = min(exp(old_t − gen_t), C).

    PPO's ratio is taken against π_old, the learner's own scoring of the rollouts; the
    tokens were drawn from π_gen, so each term is reweighted by how much likelier the
    learner finds it, truncated at C so that a token the generator found unlikely cannot
    dominate the update (TIS, Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training"; verl's and TRL's `tis` cap).

    Args:
        old_logprobs: (B, T) the learner's log-probabilities of the sampled tokens.
        generator_logprobs: (B, T) the generator's, for the same tokens.
        mask: (B, T) 0/1 or bool, 1 on the tokens trained on.
        cap: C > 0.

    Returns:
        weights: (B, T) constants, 0 off the mask.
        metrics: "tis_weight_mean" (over masked tokens), "tis_capped_fraction" (share of
            masked tokens whose weight was cut to C).
    """
    if cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    if generator_logprobs.shape != old_logprobs.shape or mask.shape != old_logprobs.shape:
        raise ValueError(f"shapes differ: old {tuple(old_logprobs.shape)}, generator "
                         f"{tuple(generator_logprobs.shape)}, mask {tuple(mask.shape)}")
    m = as_bool_mask(mask)
    with torch.no_grad():
        log_ratio = torch.where(m, old_logprobs - generator_logprobs, torch.zeros_like(old_logprobs))
        ratio = torch.exp(log_ratio.clamp(max=math.log(cap) + 1.0))  # beyond the cap: no overflow
        weights = torch.where(m, ratio.clamp(max=cap), torch.zeros_like(ratio))
        metrics = {"tis_weight_mean": masked_mean(weights, m).item(),
                   "tis_capped_fraction": masked_mean((ratio > cap).to(ratio.dtype), m).item()}
    return weights, metrics


@register_loss("value_clip")
def value_clip_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    value_clip_eps: float | None = 0.2,
    aggregation: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """Clipped value loss of PPO implementations (Schulman et al. 2017's baselines code;
    "value clipping" in Engstrom et al. 2020, §3):

        per_token = ½ · max((V − R)², (V_clip − R)²),
        V_clip = V_old + clip(V − V_old, −ε, ε),

    where R are the returns (e.g. `gae_advantages(...).returns`). The pessimistic max
    stops the value head from moving more than ε from the rollout-time values on tokens
    where moving further would be rewarded. `value_clip_eps=None` gives the plain ½(V − R)².

    Args:
        values: (B, T) current value predictions, with gradient.
        old_values: (B, T) values at rollout time (constants).
        returns: (B, T) targets (constants).
        mask: (B, T) 0/1 or bool action mask.
        value_clip_eps: ε > 0 (in the reward's units), or None for no clipping.
        aggregation: one of `masked.AGGREGATIONS`.

    Returns:
        loss: scalar with gradient, 0 on an empty mask.
        metrics: "value_clip_fraction" (share of tokens where the clipped error is the
            larger), "value_mse" (mean (V − R)²), "value_mean".
    """
    shape = values.shape
    for name, t in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != values shape {tuple(shape)}")
    if value_clip_eps is not None and value_clip_eps <= 0:
        raise ValueError(f"value_clip_eps must be positive or None, got {value_clip_eps}")
    m = as_bool_mask(mask)
    zeros = torch.zeros_like(values)
    v = torch.where(m, values, zeros)
    old = torch.where(m, old_values.detach(), zeros)
    target = torch.where(m, returns.detach(), zeros)
    unclipped = (v - target) ** 2
    if value_clip_eps is None:
        per_token = 0.5 * unclipped
        clipped = unclipped
    else:
        v_clipped = old + torch.clamp(v - old, -value_clip_eps, value_clip_eps)
        clipped = (v_clipped - target) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
    loss = aggregate_loss(per_token, m, aggregation)
    with torch.no_grad():
        metrics = {
            "value_clip_fraction": masked_mean((clipped > unclipped).to(v.dtype), m).item(),
            "value_mse": masked_mean(unclipped, m).item(),
            "value_mean": masked_mean(v, m).item(),
        }
    return loss, metrics


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy H = −Σ_v p_v log p_v of each position's next-token distribution.

    Computed in float32 from log-softmax; −inf logits (banned tokens) contribute 0
    with a finite gradient.

    Args:
        logits: (B, T, V).

    Returns:
        (B, T) float32 entropies, differentiable w.r.t. `logits`.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    # p·log p → 0 as p → 0; clamping −inf to the most negative float keeps 0·(−inf) = NaN
    # out of both the forward and the backward pass.
    logp = logp.clamp(min=torch.finfo(logp.dtype).min)
    return -(logp.exp() * logp).sum(dim=-1)


@register_loss("entropy")
def entropy_loss(
    mask: Tensor,
    *,
    logits: Tensor | None = None,
    entropy: Tensor | None = None,
    aggregation: str = "token-mean",
) -> tuple[Tensor, Metrics]:
    """The entropy bonus as a loss term: loss = −mean entropy over action tokens.

    Add it as ``total = policy_loss + c_ent · loss`` with c_ent ≥ 0 (AgentGym-RL uses
    1e-3) to reward exploration (PPO, Schulman et al. 2017, eq. 9: L^{CLIP+VF+S}).

    Args:
        mask: (B, T) 0/1 or bool action mask.
        logits: (B, T, V) policy logits, or
        entropy: (B, T) per-token entropies already computed; exactly one of the two.
        aggregation: one of `masked.AGGREGATIONS`.

    Returns:
        loss: −H (scalar, with gradient if the input has one), 0 on an empty mask.
        metrics: "entropy" (H).
    """
    if (logits is None) == (entropy is None):
        raise ValueError("pass exactly one of logits= or entropy=")
    if logits is not None:
        if logits.dim() != 3 or logits.shape[:2] != mask.shape:
            raise ValueError(f"logits must be (B, T, V) with (B, T) = mask shape {tuple(mask.shape)}, "
                             f"got {tuple(logits.shape)}")
        entropy = token_entropy(logits)
    assert entropy is not None
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy shape {tuple(entropy.shape)} != mask shape {tuple(mask.shape)}")
    mean_entropy = aggregate_loss(entropy, mask, aggregation)
    return -mean_entropy, {"entropy": mean_entropy.item()}


@register_loss("right_token")
def right_token_loss(right_logprobs: Tensor, right_mask: Tensor,
                     row_weights: Tensor | None = None) -> tuple[Tensor, Metrics]:
    """Move probability onto the continuations the environment listed, where a reply left them.

    At a rejected reply's wrong token (`Trajectory.wrong_tokens`) the available actions say
    which tokens would have continued a listed action (`Trajectory.right_tokens`); this loss
    is their negative log total probability, −log Σ_{v right} π(v | prefix). A penalty on the
    sampled token only pushes it down, and its probability may go to another wrong token; this
    term says where it should go. Ours (not from the AgentGym-RL or LOOP papers).

    Args:
        right_logprobs: (B, T) log Σ_{v right} π(v | ids[:t]) (`train.learner.token_outputs`).
        right_mask: (B, T) 0/1 or bool, 1 at the wrong tokens that have right continuations.
        row_weights: (B,) weight of each row (`TokenBatch.row_weights`: a micro-batch's rows
            weighed so that the micro-batches add up to the mean over the whole update's rows);
            absent, 1/B.

    Returns:
        loss: the mean over rows of each row's mean −right_logprob (rows without such tokens
            count as 0, so the term weighs rows as seq-mean aggregation does), weighed by
            `row_weights` when given.
        metrics: "right_prob", the mean probability of the right continuations where they are
            (0 when there are none).
    """
    if right_logprobs.shape != right_mask.shape:
        raise ValueError(f"right_logprobs shape {tuple(right_logprobs.shape)} != mask shape "
                         f"{tuple(right_mask.shape)}")
    per_row = masked_mean(-right_logprobs, right_mask, dim=-1)
    if row_weights is None:
        loss = per_row.sum() / max(right_logprobs.shape[0], 1)
    elif row_weights.shape != per_row.shape:
        raise ValueError(f"row_weights shape {tuple(row_weights.shape)} != ({right_logprobs.shape[0]},)")
    else:
        loss = (per_row * row_weights).sum()
    return loss, {"right_prob": masked_mean(right_logprobs.detach().exp(), right_mask).item()}
