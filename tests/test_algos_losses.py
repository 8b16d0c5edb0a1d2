"""Hand-computed checks for the loss terms: PPO-clip importance-ratio levels, the clipped
value loss, the entropy term, the right-token term, KL as a reward penalty, and the masked helpers."""

import math

import pytest
import torch

from agentgym_rl.algos import (
    AGGREGATIONS,
    LOSS,
    entropy_loss,
    kl_reward_penalty,
    masked_whiten,
    ppo_clip_loss,
    right_token_loss,
    token_entropy,
    turn_ids_from_mask,
    unit_log_ratio,
    value_clip_loss,
)

LN = math.log
MASK = [1, 1, 0, 0, 1, 1, 0]  # turn 1 | observation | turn 2 | padding


def _ppo(log_ratios, advantages, mask, **kw):
    """Run ppo_clip_loss with logprobs = old + log_ratios; returns loss, metrics, grad."""
    old = torch.full((1, len(log_ratios)), -1.0, dtype=torch.float64)
    logprobs = (old + torch.tensor([log_ratios], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=torch.float64)
    loss, metrics = ppo_clip_loss(logprobs, old, adv, torch.tensor([mask]), **kw)
    loss.backward()
    return loss.item(), metrics, logprobs.grad[0].tolist()


# Token log-ratios: turn 1 has ratios 1.1 and 1.25, turn 2 has 0.5 and 1.0. The
# observation/padding slots hold garbage log-ratios (5, +inf) that must not count.
# A = +1 on every action token, ε = 0.2 (clip range [0.8, 1.2]).
LR = [LN(1.1), LN(1.25), 5.0, float("inf"), LN(0.5), 0.0, 5.0]
ADV = [1.0, 1.0, 7.0, 7.0, 1.0, 1.0, 7.0]


def test_ratio_level_token():
    # Per-token ratios 1.1, 1.25, 0.5, 1.0 → −min(ρ, clip ρ) = −1.1, −1.2 (clipped), −0.5, −1.0.
    # token-mean = −3.8 / 4 = −0.95; gradient −ρ/4 on unclipped tokens, 0 on the clipped one.
    loss, metrics, grad = _ppo(LR, ADV, MASK)
    assert loss == pytest.approx(-0.95)
    assert grad == pytest.approx([-0.275, 0, 0, 0, -0.125, -0.25, 0])
    assert metrics["clip_fraction"] == pytest.approx(1 / 4)


def test_ratio_level_turn():
    # Turn 1: ρ = 1.1 · 1.25 = 1.375 → clipped to 1.2 on both tokens: −1.2, −1.2, gradient 0.
    # Turn 2: ρ = 0.5 · 1.0 = 0.5 → unclipped (A > 0): −0.5, −0.5, gradient ρ_turn/4 = 0.125.
    # token-mean = (−2.4 − 1.0) / 4 = −0.85; ratio_mean = (2·1.375 + 2·0.5) / 4 = 0.9375.
    loss, metrics, grad = _ppo(LR, ADV, MASK, ratio_level="turn")
    assert loss == pytest.approx(-0.85)
    assert grad == pytest.approx([0, 0, 0, 0, -0.125, -0.125, 0])
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(0.9375)
    # Explicit turn ids give the same; ids only need to differ between turns of a row.
    for turn_ids in ([0, 0, -1, -1, 1, 1, -1], [7, 7, -1, -1, 3, 3, -1]):
        again = _ppo(LR, ADV, MASK, ratio_level="turn", turn_ids=torch.tensor([turn_ids]))
        assert again[0] == pytest.approx(-0.85) and again[2] == pytest.approx(grad)


def test_ratio_level_trajectory():
    # One ratio for the row: 1.1 · 1.25 · 0.5 · 1.0 = 0.6875, unclipped for A > 0:
    # loss −0.6875 on every token → token-mean −0.6875, gradient 0.6875/4 = 0.171875 each.
    loss, metrics, grad = _ppo(LR, ADV, MASK, ratio_level="trajectory")
    assert loss == pytest.approx(-0.6875)
    assert grad == pytest.approx([-0.171875, -0.171875, 0, 0, -0.171875, -0.171875, 0])
    assert metrics["clip_fraction"] == 0.0


def _random_case(mask, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor(mask)
    shape = mask.shape
    old = torch.randn(shape, generator=g, dtype=torch.float64) - 2
    logprobs = old + 0.15 * torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).expand(shape).clone()
    return logprobs, old, adv, mask


def _loss_and_grad(logprobs, old, adv, mask, **kw):
    lp = logprobs.clone().requires_grad_(True)
    loss, _ = ppo_clip_loss(lp, old, adv, mask, **kw)
    loss.backward()
    return loss.detach(), lp.grad


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_turn_ratio_equals_token_ratio_when_each_turn_is_one_token(aggregation):
    case = _random_case([[1, 0, 1, 0, 0, 1, 0], [0, 1, 0, 1, 0, 0, 1]])  # every turn is one token
    token = _loss_and_grad(*case, aggregation=aggregation)
    turn = _loss_and_grad(*case, aggregation=aggregation, ratio_level="turn")
    assert torch.allclose(token[0], turn[0], atol=1e-12) and torch.allclose(token[1], turn[1], atol=1e-12)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_turn_ratio_equals_trajectory_ratio_with_one_turn(aggregation):
    case = _random_case([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], seed=1)
    turn = _loss_and_grad(*case, aggregation=aggregation, ratio_level="turn")
    trajectory = _loss_and_grad(*case, aggregation=aggregation, ratio_level="trajectory")
    assert torch.allclose(turn[0], trajectory[0], atol=1e-12) and torch.allclose(turn[1], trajectory[1], atol=1e-12)
    # With several turns they differ.
    case = _random_case([[1, 1, 0, 1, 1, 0]] * 2, seed=1)
    assert not torch.allclose(_loss_and_grad(*case, ratio_level="turn")[0],
                              _loss_and_grad(*case, ratio_level="trajectory")[0])


def test_turn_ratio_gradient_is_that_of_the_per_turn_objective():
    # With aggregation seq-mean-token-sum and an advantage constant per row, the gradient
    # must equal that of the explicit unit-level PPO objective
    #   mean over rows of Σ_turns −min(ρ_u·A, clip(ρ_u)·A),  ρ_u = exp(Σ_{s∈u} log-ratio_s).
    mask = [[1, 1, 0, 1, 1, 1, 0, 1], [1, 0, 0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 1, 0, 0]]
    logprobs, old, adv, mask = _random_case(mask, seed=2)
    _, grad = _loss_and_grad(logprobs, old, adv, mask, ratio_level="turn", aggregation="seq-mean-token-sum")
    lp = logprobs.clone().requires_grad_(True)
    turn_ids = turn_ids_from_mask(mask)
    objective = 0.0
    for row in range(3):
        for turn in range(int(turn_ids[row].max()) + 1):
            sel = turn_ids[row] == turn
            rho = torch.exp((lp[row, sel] - old[row, sel]).sum())
            a = adv[row, 0]
            objective = objective - torch.minimum(rho * a, rho.clamp(0.8, 1.2) * a)
    (objective / 3).backward()
    assert torch.allclose(grad, lp.grad, atol=1e-12)
    assert (grad != 0).any()


def test_unit_log_ratio_sums():
    lr = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4, 9.0]])
    mask = torch.tensor([MASK])
    assert unit_log_ratio(lr, mask, "token")[0].tolist() == pytest.approx([0.1, 0.2, 0, 0, 0.3, 0.4, 0])
    assert unit_log_ratio(lr, mask, "turn")[0].tolist() == pytest.approx([0.3, 0.3, 0, 0, 0.7, 0.7, 0])
    assert unit_log_ratio(lr, mask, "trajectory")[0].tolist() == pytest.approx([1.0, 1.0, 0, 0, 1.0, 1.0, 0])


def test_ratio_level_validation_and_overflow():
    lp, old, adv, mask = torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1, 1, 0]])
    with pytest.raises(ValueError, match="unknown ratio level"):
        ppo_clip_loss(lp, old, adv, mask, ratio_level="step")
    with pytest.raises(ValueError, match="only apply"):
        ppo_clip_loss(lp, old, adv, mask, turn_ids=torch.tensor([[0, 0, -1]]))
    with pytest.raises(ValueError, match=">= 0 on every action"):
        ppo_clip_loss(lp, old, adv, mask, ratio_level="turn", turn_ids=torch.tensor([[0, -1, -1]]))
    with pytest.raises(ValueError, match="integer"):
        ppo_clip_loss(lp, old, adv, mask, ratio_level="turn", turn_ids=torch.tensor([[0.0, 0.0, -1.0]]))
    # 200 tokens with log-ratio 1 each: the trajectory log-ratio 200 is clamped to 20, so
    # the loss stays finite (A < 0 takes the unclipped branch: −A·e^20).
    lp = torch.ones(1, 200, requires_grad=True)
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 200), -torch.ones(1, 200), torch.ones(1, 200), ratio_level="trajectory")
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20), rel=1e-5) and torch.isfinite(lp.grad).all()


@pytest.mark.parametrize("level", ["token", "turn", "trajectory"])
def test_ratio_levels_empty_mask_zero_loss_finite_grad(level):
    logprobs = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-2.0, float("-inf")]])
    loss, metrics = ppo_clip_loss(logprobs, old, torch.ones(1, 2), torch.zeros(1, 2), ratio_level=level)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logprobs.grad, torch.zeros(1, 2))
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------------------- value loss


def test_value_clip_loss_hand_example():
    # ε = 0.2; token 4 is masked and holds garbage.
    # tok 1: V=1.0, V_old=0.5, R=2: (V−R)² = 1; V_clip = 0.5 + 0.2 = 0.7, (0.7−2)² = 1.69
    #        → ½·max = 0.845, clipped branch wins: gradient 0
    # tok 2: V=0.0, V_old=0.5, R=1: (V−R)² = 1; V_clip = 0.3, (0.3−1)² = 0.49 → 0.5,
    #        gradient (V−R)/3 = −1/3
    # tok 3: V=V_old=0.5, R=0: both 0.25 → 0.125, gradient (V−R)/3 = 1/6
    # token-mean = (0.845 + 0.5 + 0.125) / 3 = 0.49
    values = torch.tensor([[1.0, 0.0, 0.5, float("nan")]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, float("inf")]])
    returns = torch.tensor([[2.0, 1.0, 0.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_clip_loss(values, old, returns, mask, value_clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.49)
    assert values.grad[0].tolist() == pytest.approx([0.0, -1 / 3, 1 / 6, 0.0])
    assert metrics["value_clip_fraction"] == pytest.approx(1 / 3)
    assert metrics["value_mse"] == pytest.approx((1 + 1 + 0.25) / 3)
    # Unclipped: ½·(1 + 1 + 0.25) / 3 = 0.375.
    loss, _ = value_clip_loss(values, old, returns, mask, value_clip_eps=None)
    assert loss.item() == pytest.approx(0.375)
    assert LOSS["value_clip"] is value_clip_loss


def test_value_loss_empty_mask_and_validation():
    values = torch.tensor([[1.0, 2.0]], requires_grad=True)
    loss, metrics = value_clip_loss(values, torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(values.grad, torch.zeros(1, 2))
    assert all(math.isfinite(v) for v in metrics.values())
    with pytest.raises(ValueError):
        value_clip_loss(values, torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError):
        value_clip_loss(values, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), value_clip_eps=0.0)


# ------------------------------------------------------------------------------- entropy


def test_entropy_from_logits_and_given():
    # pos 1: uniform over 4 → H = ln 4 = 1.386294
    # pos 2: p = (0.5, 0.25, 0.25, 0) with a −inf logit → H = ½ln2 + ½ln4 = 1.039721
    # pos 3: masked (its huge logits must not matter)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0],
                            [LN(0.5), LN(0.25), LN(0.25), float("-inf")],
                            [1e4, -1e4, 0.0, 0.0]]], requires_grad=True)
    assert token_entropy(logits)[0, :2].tolist() == pytest.approx([1.386294, 1.039721], abs=1e-6)
    loss, metrics = entropy_loss(torch.tensor([[1, 1, 0]]), logits=logits)
    loss.backward()
    # loss = −mean entropy = −(1.386294 + 1.039721) / 2 = −1.213008
    assert loss.item() == pytest.approx(-1.213008, abs=1e-6)
    assert metrics["entropy"] == pytest.approx(1.213008, abs=1e-6)
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 0].abs().max().item() < 1e-7  # the uniform distribution is a maximum
    assert torch.equal(logits.grad[0, 2], torch.zeros(4))  # masked position
    # Given per-token entropies instead of logits.
    loss, _ = entropy_loss(torch.tensor([[1, 0, 1]]), entropy=torch.tensor([[1.0, 5.0, 2.0]]))
    assert loss.item() == pytest.approx(-1.5)
    assert LOSS["entropy"] is entropy_loss


def test_entropy_loss_empty_mask_and_validation():
    loss, metrics = entropy_loss(torch.zeros(1, 2), entropy=torch.tensor([[1.0, float("nan")]]))
    assert loss.item() == 0.0 and metrics["entropy"] == 0.0
    with pytest.raises(ValueError, match="exactly one"):
        entropy_loss(torch.ones(1, 2))
    with pytest.raises(ValueError, match="exactly one"):
        entropy_loss(torch.ones(1, 2), logits=torch.zeros(1, 2, 3), entropy=torch.zeros(1, 2))
    with pytest.raises(ValueError):
        entropy_loss(torch.ones(1, 2), logits=torch.zeros(1, 3, 3))


def test_right_token_loss_hand_example():
    # Row 0: right continuations had probability 0.5 and 0.25 at its two wrong tokens; row 1 has
    # none, and counts as 0 in the mean over rows: (−ln 0.5 − ln 0.25) / 2 / 2.
    logprobs = torch.tensor([[0.0, LN(0.5), LN(0.25)], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1], [0, 0, 0]])
    loss, metrics = right_token_loss(logprobs, mask)
    assert math.isclose(loss.item(), (LN(2) + LN(4)) / 4, rel_tol=1e-6)
    assert math.isclose(metrics["right_prob"], 0.375, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -0.25, -0.25], [0.0, 0.0, 0.0]]))
    assert LOSS["right_token"] is right_token_loss
    with pytest.raises(ValueError):
        right_token_loss(torch.zeros(1, 2), torch.ones(1, 3))
    # Row weights in place of 1/B: row 0's mean, ln 2 + ln 4 over 2, weighed 0.75.
    weighed, _ = right_token_loss(logprobs.detach(), mask, torch.tensor([0.75, 0.25]))
    assert math.isclose(weighed.item(), 0.75 * (LN(2) + LN(4)) / 2, rel_tol=1e-6)
    with pytest.raises(ValueError, match="row_weights shape"):
        right_token_loss(logprobs.detach(), mask, torch.ones(3))


# ---------------------------------------------------------------------- KL as a reward


def test_kl_reward_penalty():
    # −β·kl on action tokens with β = 0.1: −0.05, (masked), +0.02 (a negative k1 estimate).
    kl = torch.tensor([[0.5, 9.0, -0.2]], requires_grad=True)
    out = kl_reward_penalty(kl, torch.tensor([[1, 0, 1]]), 0.1)
    assert out.tolist()[0] == pytest.approx([-0.05, 0.0, 0.02])
    assert not out.requires_grad
    with pytest.raises(ValueError):
        kl_reward_penalty(kl, torch.tensor([[1, 0, 1]]), -0.1)


# ------------------------------------------------------------------------------ masked


def test_masked_whiten_hand_example_and_degenerate_cases():
    # Selected 1, 3, 5: mean 3, population var 8/3, std 1.632993 → −1.224745, 0, 1.224745.
    x = torch.tensor([[1.0, 3.0, float("nan"), 5.0]])
    out = masked_whiten(x, torch.tensor([[1, 1, 0, 1]]))
    assert out[0].tolist() == pytest.approx([-1.224745, 0.0, 0.0, 1.224745], abs=1e-6)
    # All equal: exactly 0. In float64 the mean of 0.1, 0.1, 0.1 is 0.10000000000000002,
    # so without the constant guard (x − mean)/sqrt(1e-8) would be ~−1.4e-13, not 0.
    const = torch.full((1, 3), 0.1, dtype=torch.float64)
    assert torch.equal(masked_whiten(const, torch.ones(1, 3)), torch.zeros(1, 3, dtype=torch.float64))
    assert torch.equal(masked_whiten(torch.tensor([[4.0, 1.0]]), torch.tensor([[0, 1]])), torch.zeros(1, 2))
    assert torch.equal(masked_whiten(torch.ones(2, 3), torch.zeros(2, 3)), torch.zeros(2, 3))


def test_turn_ids_from_mask():
    mask = torch.tensor([MASK, [0, 1, 0, 1, 1, 0, 1], [0] * 7])
    assert turn_ids_from_mask(mask).tolist() == [
        [0, 0, -1, -1, 1, 1, -1],
        [-1, 0, -1, 1, 1, -1, 2],
        [-1] * 7,
    ]
    assert turn_ids_from_mask(torch.zeros(2, 0)).shape == (2, 0)


def test_the_clip_fraction_counts_the_upper_bound_clip_eps_high_sets():
    """Ratios 1.25, 1.25, 0.75, 1.1 with advantages +1, −1, −1, +1, ε = 0.2, ε_high = 0.3:
    1.25 with A > 0 is inside 1 + ε_high (it would be clipped at 1 + ε); 1.25 with A < 0 takes
    the unclipped branch either way; 0.75 with A < 0 is below 1 − ε: clipped; 1.1 is inside.
    One token of four: 0.25 (a version that used ε for the upper bound gives 0.5)."""
    old = torch.zeros(1, 4)
    logprobs = torch.log(torch.tensor([[1.25, 1.25, 0.75, 1.1]])).requires_grad_()
    advantages = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    loss, metrics = ppo_clip_loss(logprobs, old, advantages, torch.ones(1, 4), clip_eps=0.2, clip_eps_high=0.3)
    assert metrics["clip_fraction"] == pytest.approx(0.25)
    loss.backward()
    # Only the clipped token has no gradient: d(−A·ρ)/d log ρ = −A·ρ / 4 on the others.
    assert logprobs.grad.tolist()[0] == pytest.approx([-1.25 / 4, 1.25 / 4, 0.0, -1.1 / 4])
    symmetric = ppo_clip_loss(logprobs.detach(), old, advantages, torch.ones(1, 4), clip_eps=0.2)[1]
    assert symmetric["clip_fraction"] == pytest.approx(0.5)
