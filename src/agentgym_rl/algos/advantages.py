"""Advantage estimators (registered in `ADVANTAGE`; calling convention in `registry`).

Trajectory-level estimators score each sampled trajectory by its outcome reward
against a baseline and return (B,) advantages that `broadcast_to_tokens` spreads over
the trajectory's action tokens:

* grpo — group mean (and std) baseline (Shao et al. 2024, DeepSeekMath §4.1.2).
* rloo — leave-one-out mean baseline (Kool et al. 2019; Ahmadian et al. 2024).
* loop — leave-one-out baseline, no std, small-|A| rollouts dropped (Chen et al. 2025).

Token-level estimators return (B, T) advantages:

* gae — generalized advantage estimation with a critic (Schulman et al. 2016), run over
  the action tokens only so credit crosses environment observations.
* reinforce++ — discounted token returns with the KL penalty in the reward, whitened
  over the whole batch (Hu et al. 2025).
* gigpo — grpo's episode-level advantage plus a step-level one comparing the turns of a
  group's episodes that start from the same environment state (Feng et al. 2025).

In a multi-turn trajectory the (B, T) `mask` is 1 on the policy's own tokens and 0 on
the prompt, on environment observations between turns, and on padding. Token-level
estimators treat the action tokens of a row as one sequence of time steps: a mask-0
span is skipped, not a step, so the step after the last token of turn k is the first
token of turn k + 1.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

from .kl import kl_reward_penalty
from .masked import as_bool_mask, masked_mean, masked_whiten, turn_ids_from_mask
from .registry import AdvantageOutput, Metrics, register_advantage

# ----------------------------------------------------------------------------- helpers


def _check_rewards(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape (B,), got {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(rewards.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def _check_token_tensors(mask: Tensor, **tensors: Tensor | None) -> None:
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape (B, T), got {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != mask shape {tuple(mask.shape)}")


class _Groups:
    """Per-group sums of (B,) rewards: dense group index, count, total, constant flag."""

    def __init__(self, rewards: Tensor, group_ids: Tensor):
        # Map arbitrary ids to 0..G-1 so per-group statistics are dense scatter targets.
        _, self.index = torch.unique(group_ids, return_inverse=True)
        self.num = int(self.index.max()) + 1
        zeros = rewards.new_zeros(self.num)
        self.count = zeros.index_add(0, self.index, torch.ones_like(rewards))
        self.total = zeros.index_add(0, self.index, rewards)
        g_max = zeros.scatter_reduce(0, self.index, rewards, reduce="amax", include_self=False)
        g_min = zeros.scatter_reduce(0, self.index, rewards, reduce="amin", include_self=False)
        # (G,) true for groups whose rewards are all equal, including groups of one. Tested
        # with max == min, not via a std, so round-off in a mean cannot leak a tiny value.
        self.constant = g_max == g_min

    def zero_constant(self, adv: Tensor) -> Tensor:
        return torch.where(self.constant[self.index], torch.zeros_like(adv), adv)

    def metrics(self, rewards: Tensor, adv: Tensor) -> Metrics:
        return {
            "num_groups": float(self.num),
            "zero_var_group_frac": self.constant.float().mean().item(),
            "adv_abs_mean": adv.abs().mean().item(),
            "reward_mean": rewards.mean().item(),
        }


def _empty_group_metrics() -> Metrics:
    return {"num_groups": 0.0, "zero_var_group_frac": 0.0, "adv_abs_mean": 0.0, "reward_mean": 0.0}


def _reverse_discounted_sum(x: Tensor, mask: Tensor, discount: float) -> Tensor:
    """y_t = x_t + discount · y_{next action token}, over action tokens only.

    Mask-0 positions are skipped (they carry the running sum through unchanged) and get
    0; the sum ends after each row's last action token. (B, T) → (B, T). A Python loop
    over T of (B,)-wide operations: cheap next to a forward pass for T up to ~10^4.
    """
    out = torch.zeros_like(x)
    carry = x.new_zeros(x.shape[0])
    for t in range(x.shape[1] - 1, -1, -1):
        m = mask[:, t]
        carry = torch.where(m, x[:, t] + discount * carry, carry)
        out[:, t] = torch.where(m, carry, torch.zeros_like(carry))
    return out


def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Put each trajectory's outcome reward on its last action token.

    The sparse-reward form used by token-level estimators (GAE, REINFORCE++): the
    reward arrives after the policy's final action. A row with no action token has
    nowhere to receive its reward and gets all zeros (it carries no gradient anyway).

    Args:
        rewards: (B,) outcome rewards.
        mask: (B, T) 0/1 or bool action mask.

    Returns:
        (B, T) detached, dtype of `rewards`.
    """
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"expected rewards (B,) and mask (B, T), got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    m = as_bool_mask(mask)
    out = torch.zeros(m.shape, dtype=rewards.dtype, device=rewards.device)
    if m.shape[1] == 0:
        return out
    has_action = m.any(dim=-1)
    # Index of the last True per row: T − 1 − (first True in the reversed row).
    last = m.shape[1] - 1 - m.flip(-1).to(torch.uint8).argmax(dim=-1)
    rows = torch.arange(m.shape[0], device=m.device)[has_action]
    out[rows, last[has_action]] = rewards.detach()[has_action]
    return out


def discredit_turns(advantages: Tensor, mask: Tensor, turns: list[list[int]],
                    from_positions: list[list[int]] | None = None) -> tuple[Tensor, int]:
    """Cap at 0 the advantage of the listed turns' tokens, from where each went wrong.

    Meant for turns whose action the environment rejected. Such an action left the state
    as it was, so it cannot have helped the outcome, yet an outcome advantage spread over
    a successful trajectory reinforces it, most strongly where the sampler thought it
    unlikely. A negative advantage is kept: discouraging the action is right.

    The tokens before a turn's wrong token ("Action: pickup" in "Action: pickup grey box 1"
    when only a red box can be picked up) began a listed action, so they keep their
    advantage: capping them would give the actions that can be rejected (those naming an
    object) less credit than those that cannot (turning on the spot).

    Args:
        advantages: (B, T) per-token advantages, 0 off the action mask.
        mask: (B, T) 0/1 or bool action mask; turn k of a row is its k-th run of action
            tokens (`turn_ids_from_mask`).
        turns: B lists of 0-based turn indices.
        from_positions: optional B lists of column indices (`Trajectory.wrong_tokens`): a
            listed turn holding one is capped from it on; a listed turn holding none, whole.

    Returns:
        ((B, T) advantages, how many tokens lost a positive advantage).
    """
    if advantages.shape != mask.shape or advantages.dim() != 2 or len(turns) != mask.shape[0]:
        raise ValueError(f"expected (B, T) advantages and mask and B turn lists, got {tuple(advantages.shape)}, "
                         f"{tuple(mask.shape)} and {len(turns)}")
    if from_positions is not None and len(from_positions) != mask.shape[0]:
        raise ValueError(f"expected {mask.shape[0]} position lists, got {len(from_positions)}")
    turn_ids = turn_ids_from_mask(mask)
    listed = torch.zeros_like(turn_ids, dtype=torch.bool)
    for row, row_turns in enumerate(turns):
        if row_turns:
            listed[row] = torch.isin(turn_ids[row], torch.tensor(row_turns, dtype=turn_ids.dtype))
        for position in (from_positions[row] if from_positions is not None else []):
            # Earlier tokens of the same turn keep their advantage.
            listed[row, :position] &= turn_ids[row, :position] != turn_ids[row, position]
    capped = listed & (advantages > 0)
    return torch.where(capped, torch.zeros_like(advantages), advantages), int(capped.sum())


def rare_verbs(verbs: list[list[str]], share: float) -> set[str]:
    """The verbs whose count is at most `share` of all the actions in `verbs` (lists of each
    row's action verbs): in 20 actions (18 "go", 1 "pickup", 1 "turn") at share 0.05,
    {"pickup", "turn"}."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    counts = Counter(verb for row in verbs for verb in row)
    total = sum(counts.values())
    return {verb for verb, count in counts.items() if count <= share * total}


def rare_action_tokens(tokens: list[list[int]], verbs: list[list[str]], share: float,
                       counted_over: list[list[str]] | None = None) -> tuple[list[list[int]], set[str]]:
    """The action tokens whose verb is rare: an exploration bonus's positions.

    Counts the actions by verb (`rare_verbs`) over the batch, or over `counted_over` where the
    batch is a part of what was played; each row keeps the tokens of its rare actions. In a
    batch of 20 actions (18 "go", 1 "pickup", 1 "turn") at share 0.05, "pickup" and "turn" are
    rare.

    Args:
        tokens: B lists of column indices, one per action (`Trajectory.action_tokens`).
        verbs: B lists of the same lengths, each action's verb (`Trajectory.action_verbs`).
        share: in (0, 1].
        counted_over: lists of action verbs to count instead of `verbs` (None: `verbs`); they
            should include the batch's own, since a verb absent from them is never rare.

    Returns:
        (B lists of the columns of rare actions, the rare verbs).
    """
    if len(tokens) != len(verbs) or any(len(t) != len(v) for t, v in zip(tokens, verbs)):
        raise ValueError("every action token needs its verb")
    rare = rare_verbs(verbs if counted_over is None else counted_over, share)
    return [[t for t, v in zip(row_tokens, row_verbs) if v in rare] for row_tokens, row_verbs in zip(tokens, verbs)], rare


def add_at_tokens(advantages: Tensor, positions: list[list[int]], amount: float) -> Tensor:
    """Add `amount` to the advantage at the listed (row, position) tokens.

    Args:
        advantages: (B, T).
        positions: B lists of column indices.

    Returns:
        (B, T) advantages (a copy).
    """
    if len(positions) != advantages.shape[0]:
        raise ValueError(f"expected {advantages.shape[0]} position lists, got {len(positions)}")
    out = advantages.clone()
    for row, columns in enumerate(positions):
        if columns:
            out[row, columns] += amount
    return out


def penalize_tokens(advantages: Tensor, positions: list[list[int]], penalty: float) -> Tensor:
    """Subtract `penalty` from the advantage at the listed (row, position) tokens.

    A dense, token-local signal for the token where a rejected action went wrong (e.g. the
    colour in "go to grey key 1" when only a green key is in view). Put on the whole turn
    instead, it also pushes down the right tokens before it ("go to"), and the policy
    learns to prefer actions that cannot be rejected (turning on the spot) over fixing the
    wrong token (docs/RESULTS.md).

    Args:
        advantages: (B, T).
        positions: B lists of column indices.
        penalty: >= 0.

    Returns:
        (B, T) advantages.
    """
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0, got {penalty}")
    return add_at_tokens(advantages, positions, -penalty)


def token_level_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token rewards for PPO/REINFORCE++: r_t = −β·kl_t on action tokens, plus the
    outcome reward on the last action token (Ouyang et al. 2022, eq. 2; Hu et al. 2025).

    Args:
        rewards: (B,) outcome rewards.
        mask: (B, T) 0/1 or bool action mask.
        kl: (B, T) per-token KL estimate (e.g. `kl_penalty(old_logprobs, ref_logprobs,
            "k1")`); required when `kl_coef` > 0.
        kl_coef: β ≥ 0.

    Returns:
        (B, T) detached token rewards, 0 on non-action tokens.
    """
    out = outcome_token_rewards(rewards, mask)
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0:
        if kl is None:
            raise ValueError("kl_coef > 0 needs the per-token kl tensor")
        out = out + kl_reward_penalty(kl, mask, kl_coef).to(out.dtype)
    return out


# ------------------------------------------------------------------ trajectory level


@register_advantage("grpo")
def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """Group-relative advantages (GRPO, Shao et al. 2024, eq. for Â_{i,t} in §4.1.2).

    adv_i = (r_i − mean_g) / (std_g + eps) for trajectory i in group g, where the group
    holds the trajectories sampled for the same task.

    The std is the *unbiased* (n − 1) sample std, as `torch.std` computes it in the
    DeepSeekMath-style reference implementations; with the small groups used in
    practice (4–16) it gives slightly smaller advantages than the population std.
    `normalize_std=False` keeps only the mean baseline (Dr. GRPO, Liu et al. 2025); it
    then equals RLOO × (n − 1)/n.

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
        `AdvantageOutput` ``(advantages, metrics)``: advantages (B,) detached, same dtype
        as `rewards`; metrics "num_groups", "zero_var_group_frac" (groups with no
        signal), "adv_abs_mean", "reward_mean".
    """
    _check_rewards(rewards, group_ids)
    rewards = rewards.detach()
    if rewards.numel() == 0:
        return AdvantageOutput(rewards.clone(), _empty_group_metrics())
    groups = _Groups(rewards, group_ids)
    mean = groups.total / groups.count
    centered = rewards - mean[groups.index]
    if normalize_std:
        # Unbiased variance; clamp(n−1, 1) only matters for size-1 groups, zeroed below.
        var = rewards.new_zeros(groups.num).index_add(0, groups.index, centered**2) / (groups.count - 1).clamp(min=1)
        adv = centered / (var.sqrt()[groups.index] + eps)
    else:
        adv = centered
    adv = groups.zero_constant(adv)
    return AdvantageOutput(adv, groups.metrics(rewards, adv))


def _leave_one_out(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, _Groups]:
    groups = _Groups(rewards, group_ids)
    count = groups.count[groups.index]
    # Mean of the other n − 1 rewards of the group; clamp only matters for groups of
    # one, whose advantage is set to 0 by zero_constant below.
    baseline = (groups.total[groups.index] - rewards) / (count - 1).clamp(min=1)
    return groups.zero_constant(rewards - baseline), groups


@register_advantage("rloo")
def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> AdvantageOutput:
    """REINFORCE leave-one-out advantages (Kool et al. 2019; RLOO, Ahmadian et al. 2024, eq. 5).

    A_i = r_i − 1/(n − 1) · Σ_{j≠i, j in g} r_j, for trajectory i in a group g of n
    samples of the same task. Equivalently A_i = n/(n − 1) · (r_i − mean_g), so GRPO
    without std normalisation is RLOO × (n − 1)/n. Groups of one (no other sample to
    compare with) and groups whose rewards are all equal get exactly 0.

    Args:
        rewards: (B,) float outcome rewards.
        group_ids: (B,) integer task ids (any values, any order).

    Returns:
        `AdvantageOutput` ``(advantages, metrics)``: (B,) detached advantages; metrics
        "num_groups", "zero_var_group_frac", "adv_abs_mean", "reward_mean".
    """
    _check_rewards(rewards, group_ids)
    rewards = rewards.detach()
    if rewards.numel() == 0:
        return AdvantageOutput(rewards.clone(), _empty_group_metrics())
    adv, groups = _leave_one_out(rewards, group_ids)
    return AdvantageOutput(adv, groups.metrics(rewards, adv))


@register_advantage("loop")
def loop_advantages(rewards: Tensor, group_ids: Tensor, *, drop_threshold: float = 0.01) -> AdvantageOutput:
    """LOOP advantages (Leave-One-Out PPO; Chen et al. 2025, "Reinforcement Learning for
    Long-Horizon Interactive LLM Agents", §4).

    A_i = r_i − 1/(K − 1) · Σ_{j≠i} r_j over the K rollouts of the same task — the RLOO
    estimator, with *no* std normalisation (the paper's ablation found normalising hurt).
    Rollouts with |A_i| < `drop_threshold` are dropped from the update: they carry
    (almost) no signal and would only dilute the per-rollout loss average.

    Drop semantics: the returned ``keep`` (B,) bool is ``|A_i| >= drop_threshold``; a
    trainer should remove rows with ``keep == False`` from the policy batch (they must
    not count in the loss's denominator). Their advantage is also set to 0, so a trainer
    that ignores ``keep`` still gets no gradient from them. Groups of one and groups
    with all-equal rewards have A = 0 and are therefore dropped for any threshold > 0.
    With ``drop_threshold=0`` nothing is dropped and the result equals `rloo_advantages`;
    in general it equals RLOO on every kept row.

    Args:
        rewards: (B,) float outcome rewards.
        group_ids: (B,) integer task ids.
        drop_threshold: ≥ 0; the paper uses 0.01 for 0/1 task-completion rewards.

    Returns:
        `AdvantageOutput` with (B,) detached advantages, ``keep`` (B,) bool, and metrics
        "num_groups", "zero_var_group_frac", "adv_abs_mean" (after dropping),
        "reward_mean", "drop_frac" (share of rows with keep False).
    """
    _check_rewards(rewards, group_ids)
    if drop_threshold < 0:
        raise ValueError(f"drop_threshold must be >= 0, got {drop_threshold}")
    rewards = rewards.detach()
    if rewards.numel() == 0:
        return AdvantageOutput(rewards.clone(), {**_empty_group_metrics(), "drop_frac": 0.0})
    adv, groups = _leave_one_out(rewards, group_ids)
    keep = adv.abs() >= drop_threshold
    adv = torch.where(keep, adv, torch.zeros_like(adv))
    metrics = {**groups.metrics(rewards, adv), "drop_frac": 1.0 - keep.float().mean().item()}
    return AdvantageOutput(adv, metrics, keep=keep)


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


# ----------------------------------------------------------------------- token level


@register_advantage("gae")
def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = False,
) -> AdvantageOutput:
    """Generalized advantage estimation over action tokens (Schulman et al. 2016, eq. 16).

    With the action tokens of a row as time steps t_1 < t_2 < ... < t_n (mask-0 tokens
    are not steps: observation and padding tokens are skipped),

        δ_k = r_{t_k} + γ · V(t_{k+1}) − V(t_k),   V(t_{n+1}) = 0 (terminal),
        A_k = δ_k + γλ · A_{k+1},                   returns_k = A_k + V(t_k).

    So the value that bootstraps the last token of turn j is the value at the first
    token of turn j + 1: credit and value flow across environment observations, and
    values read at observation tokens are never used.

    Rewards must sit on action tokens (see `token_level_rewards`); a non-zero reward on
    a mask-0 token raises rather than being dropped.

    Args:
        token_rewards: (B, T) per-token rewards, 0 off the action mask.
        values: (B, T) critic values (detached here), read on action tokens only.
        mask: (B, T) 0/1 or bool action mask.
        gamma: discount γ in [0, 1] per action token.
        lam: GAE λ in [0, 1] (λ = 1: Monte-Carlo return − V; λ = 0: one-step TD).
        whiten: normalise the advantages to mean 0 / std 1 over all action tokens of
            the batch (`masked_whiten`), as PPO implementations usually do. The returns
            are computed from the raw advantages.

    Returns:
        `AdvantageOutput` with (B, T) advantages and ``returns`` (value targets), both
        detached and 0 on mask-0 tokens; metrics "adv_mean", "adv_abs_mean" (raw,
        before whitening), "return_mean", "value_mean" (over action tokens).
    """
    _check_token_tensors(mask, token_rewards=token_rewards, values=values)
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    m = as_bool_mask(mask)
    rewards = token_rewards.detach()
    if bool(((rewards != 0) & ~m).any()):
        raise ValueError("token_rewards are non-zero on mask-0 tokens; put rewards on action tokens")
    zeros = torch.zeros_like(rewards)
    rewards = torch.where(m, rewards, zeros)
    values = torch.where(m, values.detach().to(rewards.dtype), zeros)  # garbage off-mask is never read

    # δ needs V of the *next action token*: carried backwards across mask-0 positions.
    deltas = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        step = m[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        deltas[:, t] = torch.where(step, delta, torch.zeros_like(delta))
        next_value = torch.where(step, values[:, t], next_value)
    raw = _reverse_discounted_sum(deltas, m, gamma * lam)
    returns = torch.where(m, raw + values, zeros)
    advantages = masked_whiten(raw, m) if whiten else raw
    metrics = {
        "adv_mean": masked_mean(raw, m).item(),
        "adv_abs_mean": masked_mean(raw.abs(), m).item(),
        "return_mean": masked_mean(returns, m).item(),
        "value_mean": masked_mean(values, m).item(),
    }
    return AdvantageOutput(advantages, metrics, returns=returns)


@register_advantage("reinforce++")
def reinforce_pp_advantages(
    rewards: Tensor,
    mask: Tensor,
    kl: Tensor | None = None,
    *,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> AdvantageOutput:
    """REINFORCE++ advantages (Hu et al. 2025, "REINFORCE++", eqs. 8–10).

    Per-token reward on action tokens: r_t = −β·kl_t, plus the outcome reward on the
    last action token (`token_level_rewards`). Return G_t = Σ_{s ≥ t} γ^{(steps from t
    to s)} r_s over the row's action tokens (γ = 1 gives the paper's
    r(x, y) − β Σ_{i≥t} KL(i)). The advantages are G whitened over *all* action tokens
    of the batch — global normalisation, not per group:

        A_t = (G_t − mean_batch G) / sqrt(var_batch G + eps)   (population variance).

    There is no critic and no group baseline (that variant is "REINFORCE++ w/ baseline").
    The KL should be estimated with the sampling (old) policy, e.g.
    ``kl_penalty(old_logprobs, ref_logprobs, "k1")`` as in the paper's eq. 9; it is
    treated as a constant. With every return equal (e.g. one trajectory and no KL) the
    advantages are exactly 0.

    Args:
        rewards: (B,) outcome rewards.
        mask: (B, T) 0/1 or bool action mask.
        kl: (B, T) per-token KL estimate; required when `kl_coef` > 0, read on action
            tokens only.
        kl_coef: β ≥ 0.
        gamma: discount per action token, in [0, 1].
        eps: added to the variance.

    Returns:
        `AdvantageOutput` with (B, T) whitened advantages and ``returns`` (the raw G),
        both detached and 0 off the mask; metrics "return_mean", "kl_reward_mean" (mean
        per-trajectory sum of −β·kl), "adv_abs_mean", "reward_mean".
    """
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"expected rewards (B,) and mask (B, T), got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    _check_token_tensors(mask, kl=kl)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    m = as_bool_mask(mask)
    rewards = rewards.detach()
    token_rewards = token_level_rewards(rewards, m, kl, kl_coef)
    returns = _reverse_discounted_sum(token_rewards, m, gamma)
    advantages = masked_whiten(returns, m, eps=eps)
    kl_part = token_rewards - outcome_token_rewards(rewards, m)
    metrics = {
        "return_mean": masked_mean(returns, m).item(),
        "kl_reward_mean": kl_part.sum(dim=-1).mean().item() if rewards.numel() else 0.0,
        "adv_abs_mean": masked_mean(advantages.abs(), m).item(),
        "reward_mean": rewards.mean().item() if rewards.numel() else 0.0,
    }
    return AdvantageOutput(advantages, metrics, returns=returns)


# ------------------------------------------------------------------------ step level


def _turn_returns(rewards: Tensor, turns: Tensor, rows: Tensor, turn: Tensor, turn_rewards: Tensor | None,
                  gamma: float) -> Tensor:
    """GiGPO's discounted return of each turn listed by (`rows`, `turn`) (N,), `turns` (B, T)
    being every token's turn index (−1 off the action tokens): from `turn_rewards` (B, K),
    R_k = r_k + γ·R_{k+1} (a turn past K: 0); without them, the outcome `rewards` (B,) after the
    last turn, γ^(n − 1 − k)·r."""
    if turn_rewards is None:
        last_turn = turns.max(dim=-1).values if turns.shape[1] else turns.new_zeros(turns.shape[0])
        return rewards[rows] * gamma ** (last_turn[rows] - turn).to(rewards.dtype)
    if turn_rewards.dim() != 2 or turn_rewards.shape[0] != turns.shape[0]:
        raise ValueError(f"turn_rewards must be (B, K) with B = {turns.shape[0]}, got {tuple(turn_rewards.shape)}")
    by_turn = torch.cat([turn_rewards.detach().to(rewards.dtype), rewards.new_zeros(turns.shape[0], 1)], dim=1)
    for k in range(by_turn.shape[1] - 2, -1, -1):
        by_turn[:, k] += gamma * by_turn[:, k + 1]
    return by_turn[rows, turn.clamp(max=by_turn.shape[1] - 1)]


def _turn_starts(turns: Tensor) -> tuple[Tensor, Tensor]:
    """(rows, columns) of each turn's first token in `turns` (B, T), a token's turn index (−1 off
    the action tokens): where the turn id differs from the token before's."""
    before = torch.full_like(turns, -1)
    before[:, 1:] = turns[:, :-1]
    return ((turns >= 0) & (turns != before)).nonzero(as_tuple=True)


def _on_tokens(per_turn: Tensor, rows: Tensor, turn: Tensor, turns: Tensor, mask: Tensor) -> Tensor:
    """(B, T): `per_turn` (N,), the value of turn `turn` of row `rows`, on every action token of
    that turn (`turns`, each token's turn index), 0 off the `mask`."""
    table = per_turn.new_zeros(mask.shape[0], int(turn.max()) + 1 if turn.numel() else 1)
    table[rows, turn] = per_turn
    return torch.where(mask, table.gather(1, turns.clamp(min=0)), per_turn.new_zeros(mask.shape))


def _check_gigpo_inputs(rewards: Tensor, group_ids: Tensor, mask: Tensor, state_ids: Tensor | None,
                        gamma: float) -> None:
    _check_rewards(rewards, group_ids)
    _check_token_tensors(mask, state_ids=state_ids)
    if mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask has {mask.shape[0]} rows for {rewards.shape[0]} rewards")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if state_ids is not None and (state_ids.dtype.is_floating_point or state_ids.dtype == torch.bool):
        raise ValueError(f"state_ids must be an integer tensor, got {state_ids.dtype}")


def _step_advantages(returns: Tensor, groups: Tensor, state: Tensor, normalize_std: bool,
                     eps: float) -> tuple[Tensor, Tensor, Tensor, int]:
    """GiGPO's step level over N turns: each turn's `returns` (N,) compared within its step group,
    the turns of one task (`groups`, (N,)) taken from one state (`state`, (N,), −1: none).
    Returns (advantages (N,), keyed (N,) bool: has a state, grouped (N,) bool: in a step group of
    two or more, the number of such step groups)."""
    keyed = state >= 0
    step = torch.zeros_like(returns)
    grouped = torch.zeros_like(keyed)
    if not keyed.any():
        return step, keyed, grouped, 0
    # A step group is one (task, state) pair: dense ids over the keyed turns.
    pairs = torch.stack([groups[keyed].long(), state[keyed]], dim=1)
    _, step_group = torch.unique(pairs, dim=0, return_inverse=True)
    step[keyed] = grpo_advantages(returns[keyed], step_group, normalize_std=normalize_std, eps=eps).advantages
    sizes = torch.bincount(step_group)
    grouped[keyed] = sizes[step_group] > 1
    return step, keyed, grouped, int((sizes > 1).sum())


@register_advantage("gigpo")
def gigpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    state_ids: Tensor | None = None,
    turn_rewards: Tensor | None = None,
    *,
    normalize_std: bool = True,
    step_weight: float = 1.0,
    gamma: float = 0.95,
    eps: float = 1e-6,
) -> AdvantageOutput:
    """GiGPO: episode-level plus step-level group advantages (Feng et al. 2025, "Group-in-Group
    Policy Optimization for LLM Agent Training", §4).

    Episode level: the GRPO advantage A^E_i of trajectory i in its task's group (`grpo_advantages`).
    Step level: turns that start from the same environment state (the same state id) in the
    episodes of one group form a step group, and each turn is compared with the others there by
    its discounted return. Turn k's return is R_{i,k} = Σ_{j ≥ k} γ^(j − k) · r_{i,j} over the
    rewards of turns k..n_i − 1 (`turn_rewards`: a penalty counts at the turn that earned it);
    without them the outcome reward r_i arrives after the last turn, R_{i,k} = γ^(n_i − 1 − k) · r_i.
    Among turns taken from one state, the one that reached the goal in fewer turns scores higher.
    Then

        A^S_{i,k} = (R_{i,k} − mean_s R) / (std_s R + eps)   (without std: R − mean),
        A_{i,k}   = A^E_i + step_weight · A^S_{i,k}   on every action token of turn k.

    A step group of one turn, or whose returns all tie, adds 0; a turn without a state id
    (−1: its environment gives none) keeps only A^E. Unlike the episode level, a group of
    episodes that all succeeded still has a step-level signal when some took detours (a rejected
    action leaves the state as it was, so the turn after it starts from the same state and
    reaches the goal one turn sooner).

    Args:
        rewards: (B,) outcome rewards.
        group_ids: (B,) integer task ids.
        mask: (B, T) 0/1 or bool action mask; turn k of a row is its k-th run of action tokens.
        state_ids: (B, T) integer id of the state each token's turn was taken from, the same on
            every token of a turn (read at its first token); −1 for no state. Ids are compared
            only within a group. None: no turn has one (GiGPO is then GRPO).
        turn_rewards: (B, K) reward of each turn, 0 past a row's last; K ≥ the mask's turns
            (a turn of the mask beyond K gets return 0). None: the outcome after the last turn.
        normalize_std: divide by the std, at both levels (verl-agent's "mean_std_norm"; False
            is its "mean_norm").
        step_weight: ω, the weight of the step level.
        gamma: discount per turn, in [0, 1].
        eps: added to the stds.

    Returns:
        `AdvantageOutput` with (B, T) detached advantages, 0 off the mask; metrics of the
        episode level ("num_groups", "zero_var_group_frac", "reward_mean", "episode_adv_abs_mean"),
        of the step level ("keyed_turn_frac": turns with a state id, "step_groups": step groups of
        two or more turns, "step_grouped_turn_frac": turns in one, "step_adv_abs_mean" over keyed
        turns) and "adv_abs_mean" over action tokens.
    """
    _check_gigpo_inputs(rewards, group_ids, mask, state_ids, gamma)
    m = as_bool_mask(mask)
    rewards = rewards.detach()
    episode = grpo_advantages(rewards, group_ids, normalize_std=normalize_std, eps=eps)
    advantages = broadcast_to_tokens(episode.advantages, m)
    turns = turn_ids_from_mask(m)
    rows, columns = _turn_starts(turns)
    turn = turns[rows, columns]
    returns = _turn_returns(rewards, turns, rows, turn, turn_rewards, gamma)
    state = state_ids[rows, columns].long() if state_ids is not None else torch.full_like(turn, -1)
    step, keyed, grouped, step_groups = _step_advantages(returns, group_ids[rows], state, normalize_std, eps)
    advantages = advantages + step_weight * _on_tokens(step, rows, turn, turns, m)
    count = max(turn.numel(), 1)
    metrics = {
        **{key: episode.metrics[key] for key in ("num_groups", "zero_var_group_frac", "reward_mean")},
        "episode_adv_abs_mean": episode.metrics["adv_abs_mean"],
        "keyed_turn_frac": float(keyed.sum()) / count,
        "step_groups": float(step_groups),
        "step_grouped_turn_frac": float(grouped.sum()) / count,
        "step_adv_abs_mean": step[keyed].abs().mean().item() if keyed.any() else 0.0,
        "adv_abs_mean": masked_mean(advantages.abs(), m).item(),
    }
    return AdvantageOutput(advantages, metrics)
