"""Hand-computed checks for the advantage estimators: rloo, loop, gae, reinforce++, and the
calling convention (AdvantageOutput, compute_advantages, register_advantage)."""

import copy
import math
import pickle

import pytest
import torch

from agentgym_rl.algos import (
    ADVANTAGE,
    AdvantageOutput,
    advantage_inputs,
    broadcast_to_tokens,
    compute_advantages,
    discredit_turns,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    loop_advantages,
    outcome_token_rewards,
    penalize_tokens,
    rare_action_tokens,
    register_advantage,
    reinforce_pp_advantages,
    rloo_advantages,
    token_level_rewards,
)

# The multi-turn layout used throughout: turn 1 = tokens 0–1, an environment observation
# at 2–3, turn 2 = tokens 4–5, padding at 6.
MASK = [1, 1, 0, 0, 1, 1, 0]


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def ids(values):
    return torch.tensor(values, dtype=torch.long)


def assert_rows(x, expected, atol=1e-9):
    """Compare a (B, T) tensor with nested lists written out in a test."""
    expected = torch.tensor(expected, dtype=x.dtype)
    assert torch.allclose(x, expected, atol=atol), f"{x.tolist()} != {expected.tolist()}"


# ---------------------------------------------------------------------------------- RLOO


def test_rloo_hand_example_with_constant_and_singleton_groups():
    # Group 0: rewards 1,0,0,1. For r=1: 1 − (0+0+1)/3 = 2/3; for r=0: 0 − (1+0+1)/3 = −2/3.
    # Group 1: 1,1 → all equal → 0.  Group 2: one sample → nothing to compare with → 0.
    out = rloo_advantages(t([1, 0, 0, 1, 1, 1, 0.7]), ids([0, 0, 0, 0, 1, 1, 2]))
    assert isinstance(out, AdvantageOutput) and out.returns is None and out.keep.all()
    adv, metrics = out
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0])
    assert metrics["num_groups"] == 3.0
    assert metrics["zero_var_group_frac"] == pytest.approx(2 / 3)


def test_rloo_uneven_interleaved_groups():
    # Group 4 = positions 0,2,4: rewards 3,1,2 → 3 − (1+2)/2 = 1.5, 1 − (3+2)/2 = −1.5, 2 − (3+1)/2 = 0.
    # Group 9 = positions 1,3: rewards 0.5, 0 → 0.5 − 0 = 0.5, 0 − 0.5 = −0.5.
    adv, _ = rloo_advantages(t([3, 0.5, 1, 0, 2]), ids([4, 9, 4, 9, 4]))
    assert adv.tolist() == pytest.approx([1.5, 0.5, -1.5, -0.5, 0.0])


def test_rloo_all_equal_is_exactly_zero_and_empty_batch():
    adv, metrics = rloo_advantages(torch.full((3,), 0.1, dtype=torch.float64), ids([0, 0, 0]))
    assert torch.equal(adv, torch.zeros(3, dtype=torch.float64))
    adv, metrics = rloo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert adv.shape == (0,) and all(math.isfinite(v) for v in metrics.values())


def test_grpo_without_std_is_rloo_times_n_minus_1_over_n():
    # RLOO: r_i − (S − r_i)/(n−1) = n/(n−1)·(r_i − mean), so mean-only GRPO = RLOO·(n−1)/n.
    # Groups of size 1 (both 0), 2, 3 and 5, interleaved.
    g = torch.Generator().manual_seed(0)
    groups = ids([0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3])[torch.randperm(11, generator=g)]
    rewards = torch.rand(11, generator=g, dtype=torch.float64)
    n = torch.bincount(groups)[groups].to(torch.float64)
    rloo, _ = rloo_advantages(rewards, groups)
    grpo, _ = grpo_advantages(rewards, groups, normalize_std=False)
    assert torch.allclose(grpo, rloo * (n - 1) / n, atol=1e-12)
    assert rloo[groups == 0].item() == 0.0
    assert (rloo[groups != 0] != 0).all()


def test_rloo_rejects_bad_inputs():
    with pytest.raises(ValueError):
        rloo_advantages(torch.zeros(3), torch.zeros(3))  # float group ids
    with pytest.raises(ValueError):
        rloo_advantages(torch.zeros(3, 1), torch.zeros(3, 1, dtype=torch.long))


# ---------------------------------------------------------------------------------- LOOP


def test_loop_hand_example_drops_small_advantages():
    # Group 0: rewards 1, 0, 0.505 → leave-one-out baselines (0+0.505)/2, (1+0.505)/2, (1+0)/2:
    #   A = 1 − 0.2525 = 0.7475,  0 − 0.7525 = −0.7525,  0.505 − 0.5 = 0.005 (< 0.01: dropped).
    # Group 1: one rollout → A = 0 → dropped.  Group 2: 0.3, 0.3 → A = 0 → dropped.
    out = loop_advantages(t([1, 0, 0.505, 1, 0.3, 0.3]), ids([0, 0, 0, 1, 2, 2]), drop_threshold=0.01)
    assert out.keep.tolist() == [True, True, False, False, False, False]
    assert out.advantages.tolist() == pytest.approx([0.7475, -0.7525, 0, 0, 0, 0], abs=1e-12)
    assert out.metrics["drop_frac"] == pytest.approx(4 / 6)
    # No std normalisation: GRPO would have divided group 0 by its std.
    assert out.advantages[0].item() != pytest.approx(grpo_advantages(t([1, 0, 0.505]), ids([0, 0, 0]))[0][0].item())


def test_loop_equals_rloo_on_outcome_rewards():
    # 0/1 task-completion rewards in groups of K = 6 (LOOP's setting): every non-zero
    # leave-one-out advantage is at least 1/5 in size, so threshold 0.01 only drops the
    # zero ones, and LOOP's advantages equal RLOO's everywhere.
    g = torch.Generator().manual_seed(3)
    rewards = (torch.rand(24, generator=g) < 0.4).to(torch.float64)
    groups = torch.arange(4).repeat_interleave(6)
    rloo, _ = rloo_advantages(rewards, groups)
    loop = loop_advantages(rewards, groups)
    assert torch.equal(loop.advantages, rloo)
    assert torch.equal(loop.keep, rloo != 0)
    # With continuous rewards some |A| < threshold: equal to RLOO on kept rows, 0 on the rest.
    rewards = torch.rand(24, generator=g, dtype=torch.float64)
    rloo, _ = rloo_advantages(rewards, groups)
    loop = loop_advantages(rewards, groups, drop_threshold=0.1)
    assert torch.equal(loop.keep, rloo.abs() >= 0.1) and not loop.keep.all() and loop.keep.any()
    assert torch.equal(loop.advantages, torch.where(loop.keep, rloo, torch.zeros_like(rloo)))
    # Threshold 0 keeps everything and is exactly RLOO.
    loop = loop_advantages(rewards, groups, drop_threshold=0.0)
    assert loop.keep.all() and torch.equal(loop.advantages, rloo)


def test_loop_threshold_boundary():
    # Rewards 1, 0 → A = ±1. "|A| < threshold is dropped": |A| = threshold is kept.
    assert loop_advantages(t([1.0, 0.0]), ids([0, 0]), drop_threshold=1.0).keep.tolist() == [True, True]
    assert loop_advantages(t([1.0, 0.0]), ids([0, 0]), drop_threshold=1.0001).keep.tolist() == [False, False]
    # Threshold 0 drops nothing, not even rows with A = 0 (a singleton group here).
    assert loop_advantages(t([1.0, 0.0, 1.0]), ids([0, 0, 1]), drop_threshold=0.0).keep.all()


def test_loop_empty_batch_and_bad_threshold():
    out = loop_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert out.advantages.shape == (0,) and out.keep.shape == (0,)
    with pytest.raises(ValueError, match="drop_threshold"):
        loop_advantages(torch.zeros(2), ids([0, 0]), drop_threshold=-0.1)


# ----------------------------------------------------------------------------------- GAE


def _gae_example(gamma, lam, **kw):
    # Action tokens 0,1 | observation 2,3 | action tokens 4,5 | padding 6. Values at
    # mask-0 tokens are garbage (9, NaN) and must never be read. Reward 1 at the end.
    rewards = t([[0, 0, 0, 0, 0, 1, 0], [0] * 7])
    values = t([[0.5, 0.6, 9, float("nan"), 0.7, 0.8, 9], [1.0] * 7])
    mask = t([MASK, [0] * 7])
    return gae_advantages(rewards, values, mask, gamma=gamma, lam=lam, **kw)


def test_gae_skips_observation_tokens():
    # Steps are the action tokens 0,1,4,5 with V = 0.5, 0.6, 0.7, 0.8; γ = 0.9, λ = 0.5:
    #   δ5 = 1 + 0.9·0   − 0.8 = 0.2        (terminal after the last action token)
    #   δ4 = 0 + 0.9·0.8 − 0.7 = 0.02
    #   δ1 = 0 + 0.9·0.7 − 0.6 = 0.03       (next value = V at token 4, not at token 2)
    #   δ0 = 0 + 0.9·0.6 − 0.5 = 0.04
    #   A5 = 0.2, A4 = 0.02 + 0.45·0.2 = 0.11, A1 = 0.03 + 0.45·0.11 = 0.0795,
    #   A0 = 0.04 + 0.45·0.0795 = 0.075775;  returns = A + V = 0.575775, 0.6795, 0.81, 1.0
    out = _gae_example(0.9, 0.5)
    assert out.advantages[0].tolist() == pytest.approx([0.075775, 0.0795, 0, 0, 0.11, 0.2, 0], abs=1e-12)
    assert out.returns[0].tolist() == pytest.approx([0.575775, 0.6795, 0, 0, 0.81, 1.0, 0], abs=1e-12)
    # The row without action tokens gets zeros, not NaN.
    assert out.advantages[1].tolist() == [0.0] * 7 and out.returns[1].tolist() == [0.0] * 7
    assert out.level == "token" and out.keep.all()
    assert all(math.isfinite(v) for v in out.metrics.values())
    assert out.metrics["value_mean"] == pytest.approx((0.5 + 0.6 + 0.7 + 0.8) / 4)


def test_gae_lambda_limits():
    # λ = 0: A = δ (one-step TD errors from the example above).
    assert _gae_example(0.9, 0.0).advantages[0].tolist() == pytest.approx([0.04, 0.03, 0, 0, 0.02, 0.2, 0], abs=1e-12)
    # γ = λ = 1: A = (sum of future rewards) − V = 1 − V on every action token.
    out = _gae_example(1.0, 1.0)
    assert out.advantages[0].tolist() == pytest.approx([0.5, 0.4, 0, 0, 0.3, 0.2, 0], abs=1e-12)
    assert out.returns[0].tolist() == pytest.approx([1, 1, 0, 0, 1, 1, 0], abs=1e-12)


def test_gae_equals_gae_on_the_sequence_with_observations_removed():
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(3, 12, generator=g) < 0.6).to(torch.float64)
    rewards = torch.randn(3, 12, generator=g, dtype=torch.float64) * mask
    values = torch.randn(3, 12, generator=g, dtype=torch.float64)
    out = gae_advantages(rewards, values, mask, gamma=0.97, lam=0.9)
    for row in range(3):
        keep = mask[row].bool()
        n = int(keep.sum())
        compact = gae_advantages(rewards[row, keep][None], values[row, keep][None], torch.ones(1, n),
                                 gamma=0.97, lam=0.9)
        assert torch.allclose(out.advantages[row, keep], compact.advantages[0], atol=1e-12)
        assert torch.allclose(out.returns[row, keep], compact.returns[0], atol=1e-12)
        assert (out.advantages[row, ~keep] == 0).all()


def test_gae_whiten_and_validation():
    out = _gae_example(0.9, 0.5, whiten=True)
    m = t([MASK, [0] * 7]).bool()
    selected = out.advantages[m]
    assert selected.mean().item() == pytest.approx(0.0, abs=1e-9)
    # var/(var + 1e-8) with the raw var ≈ 0.0025 of these small advantages → 1 − 4e-6.
    assert selected.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert out.returns[0].tolist() == pytest.approx([0.575775, 0.6795, 0, 0, 0.81, 1.0, 0], abs=1e-12)
    with pytest.raises(ValueError, match="mask-0"):  # a reward on an observation token
        gae_advantages(t([[0, 1, 0]]), t([[0, 0, 0]]), t([[1, 0, 1]]))
    with pytest.raises(ValueError):
        gae_advantages(t([[0, 0]]), t([[0, 0, 0]]), t([[1, 0, 1]]))
    with pytest.raises(ValueError):
        gae_advantages(t([[0]]), t([[0]]), t([[1]]), gamma=1.5)


def test_gae_empty_mask_no_nan():
    out = gae_advantages(torch.zeros(2, 4), torch.full((2, 4), float("nan")), torch.zeros(2, 4), whiten=True)
    assert torch.equal(out.advantages, torch.zeros(2, 4)) and torch.equal(out.returns, torch.zeros(2, 4))
    assert all(math.isfinite(v) for v in out.metrics.values())


# --------------------------------------------------------------------------- REINFORCE++


def test_token_rewards_on_last_action_token_with_kl_penalty():
    mask = t([MASK, [0] * 7, [0, 1, 0, 0, 0, 0, 0]])
    out = outcome_token_rewards(t([1.0, 5.0, -2.0]), mask)
    assert out.tolist() == [[0, 0, 0, 0, 0, 1, 0], [0] * 7, [0, -2, 0, 0, 0, 0, 0]]
    # −β·kl on action tokens (β = 0.1); the garbage kl = 9 on mask-0 tokens is ignored.
    kl = t([[0.5, 0.0, 9, 9, 1.0, 0.5, 9], [9] * 7, [9, 0.2, 9, 9, 9, 9, 9]])
    out = token_level_rewards(t([1.0, 5.0, -2.0]), mask, kl, kl_coef=0.1)
    assert_rows(out, [[-0.05, 0, 0, 0, -0.1, 0.95, 0], [0] * 7, [0, -2.02, 0, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="kl"):
        token_level_rewards(t([1.0]), t([[1]]), None, kl_coef=0.1)


def test_reinforce_pp_hand_example():
    # Row 0 (reward 1), mask [1,1,0,0,1,1,0], kl on action tokens 0.5, 0.0, 1.0, 0.5; β = 0.1:
    #   token rewards −0.05, 0, −0.1, −0.05 + 1 = 0.95
    #   returns (γ = 1, sums to the end over action tokens): 0.80, 0.85, 0.85, 0.95
    # Row 1 (reward 0), mask [1,1,1,0,0,0,0], kl 0.0, 1.0, 0.0:
    #   token rewards 0, −0.1, 0 → returns −0.1, −0.1, 0.0
    # Global whitening over the 7 action tokens: mean = 3.25/7 = 0.4642857,
    #   population var = 0.2140816, std = 0.4626896 →
    #   A = 0.725571, 0.833635, 0.833635, 1.049763 | −1.219577, −1.219577, −1.003450
    mask = t([MASK, [1, 1, 1, 0, 0, 0, 0]])
    kl = t([[0.5, 0.0, 9, 9, 1.0, 0.5, 9], [0.0, 1.0, 0.0, 9, 9, 9, 9]])
    out = reinforce_pp_advantages(t([1.0, 0.0]), mask, kl, kl_coef=0.1)
    assert_rows(out.returns, [[0.8, 0.85, 0, 0, 0.85, 0.95, 0], [-0.1, -0.1, 0, 0, 0, 0, 0]])
    assert_rows(out.advantages, [[0.725571, 0.833635, 0, 0, 0.833635, 1.049763, 0],
                                 [-1.219577, -1.219577, -1.003450, 0, 0, 0, 0]], atol=1e-6)
    # Mean per-trajectory KL reward: (−0.2 + −0.1) / 2.
    assert out.metrics["kl_reward_mean"] == pytest.approx(-0.15)


def test_reinforce_pp_discount_skips_observations_and_whitening_is_global():
    # γ = 0.5, no KL, row 0 only counts action tokens as steps: 1 at token 5, 0.5 at 4,
    # 0.25 at 1 (not 0.5³ — the observation tokens 2,3 are not steps), 0.125 at 0.
    mask = t([MASK, [1, 1, 0, 0, 0, 0, 0]])
    out = reinforce_pp_advantages(t([1.0, 3.0]), mask, gamma=0.5)
    assert_rows(out.returns, [[0.125, 0.25, 0, 0, 0.5, 1.0, 0], [1.5, 3.0, 0, 0, 0, 0, 0]])
    # Global: one mean/std over all 6 action tokens of the batch, not per row.
    selected = out.advantages[mask.bool()]
    assert selected.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert selected.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    assert (out.advantages[0, mask[0].bool()] < 0).all()  # row 0's returns are all below the batch mean


def test_reinforce_pp_degenerate_batches():
    # One trajectory, no KL: every return equals the reward → no signal → exactly 0.
    out = reinforce_pp_advantages(t([1.0]), t([MASK]))
    assert torch.equal(out.advantages, torch.zeros(1, 7, dtype=torch.float64))
    out = reinforce_pp_advantages(t([1.0, 0.0]), torch.zeros(2, 5))  # empty mask
    assert torch.equal(out.advantages, torch.zeros(2, 5))
    assert all(math.isfinite(v) for v in out.metrics.values())
    with pytest.raises(ValueError, match="kl"):
        reinforce_pp_advantages(t([1.0]), t([MASK]), kl_coef=0.1)


# ------------------------------------------------------------------ calling convention


def test_advantage_output_is_the_legacy_two_tuple():
    out = grpo_advantages(t([1.0, 0.0]), ids([0, 0]))
    adv, metrics = out  # the trainer's call pattern keeps working
    assert isinstance(out, tuple) and len(out) == 2 and out[0] is adv and out[1] is metrics
    assert out.advantages is adv and out.metrics is metrics and out.level == "trajectory"
    mask = t([[1, 0, 1], [0, 1, 1]])
    assert torch.equal(out.token_advantages(mask), broadcast_to_tokens(adv, mask))
    clone = pickle.loads(pickle.dumps(loop_advantages(t([1.0, 0.0, 0.0]), ids([0, 0, 1]))))
    assert clone.keep.tolist() == [True, True, False] and isinstance(clone, AdvantageOutput)
    assert copy.deepcopy(_gae_example(0.9, 0.5)).returns[0, 5].item() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        AdvantageOutput(adv, metrics, keep=torch.ones(3, dtype=torch.bool))


def test_token_advantages_of_token_level_output_masks():
    out = AdvantageOutput(t([[1.0, 2.0, 3.0]]), {})
    assert out.token_advantages(t([[1, 0, 1]])).tolist() == [[1.0, 0.0, 3.0]]


def test_advantage_inputs_describe_each_estimator():
    assert advantage_inputs("grpo") == (("rewards", "group_ids"), (), ("normalize_std", "eps"))
    assert advantage_inputs("rloo") == (("rewards", "group_ids"), (), ())
    assert advantage_inputs("loop") == (("rewards", "group_ids"), (), ("drop_threshold",))
    assert advantage_inputs("gae") == (("token_rewards", "values", "mask"), (), ("gamma", "lam", "whiten"))
    assert advantage_inputs("reinforce++") == (("rewards", "mask"), ("kl",), ("kl_coef", "gamma", "eps"))


def test_compute_advantages_picks_fields_and_rejects_mistakes():
    mask = t([MASK, [1, 1, 1, 0, 0, 0, 0]])
    fields = {"rewards": t([1.0, 0.0]), "group_ids": ids([0, 0]), "mask": mask,
              "kl": t([[0.5, 0.0, 9, 9, 1.0, 0.5, 9], [0.0, 1.0, 0.0, 9, 9, 9, 9]]),
              "values": None}
    direct = reinforce_pp_advantages(fields["rewards"], mask, fields["kl"], kl_coef=0.1)
    via = compute_advantages("reinforce++", fields, kl_coef=0.1)
    assert torch.equal(via.advantages, direct.advantages)
    assert torch.equal(compute_advantages("rloo", fields).advantages, rloo_advantages(t([1.0, 0.0]), ids([0, 0]))[0])
    with pytest.raises(ValueError, match="unknown batch field"):
        compute_advantages("rloo", {**fields, "reward": t([1.0, 0.0])})
    with pytest.raises(ValueError, match="needs batch field.*'values'"):
        compute_advantages("gae", {**fields, "token_rewards": torch.zeros(2, 7)})
    with pytest.raises(ValueError, match="does not take 'normalize_std'"):
        compute_advantages("rloo", fields, normalize_std=False)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages("ppo", fields)
    with pytest.raises(TypeError):  # called directly, Python rejects unknown inputs too
        ADVANTAGE["rloo"](t([1.0]), ids([0]), normalize_std=True)


def test_register_advantage_enforces_the_convention():
    with pytest.raises(TypeError, match="not one of"):
        @register_advantage("bad1")
        def bad1(rewards, gamma=1.0):  # hyper-parameter not keyword-only
            pass
    with pytest.raises(TypeError, match="swallow"):
        @register_advantage("bad2")
        def bad2(rewards, **kwargs):
            pass
    with pytest.raises(TypeError, match="needs a default"):
        @register_advantage("bad3")
        def bad3(rewards, *, gamma):
            pass
    assert not {"bad1", "bad2", "bad3"} & set(ADVANTAGE)


def test_discredit_turns_caps_only_the_listed_turns_positive_tokens():
    # Row 0: turns 0 (tokens 0-1), 1 (4-5), 2 (7); turn 1 listed: its +0.5s become 0.
    # Row 1: a lost episode, turn 0 listed: its negative advantage stays.
    # Row 2: nothing listed.
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1], [1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 1, 0, 0]])
    advantages = torch.tensor([[0.5, 0.5, 0, 0, 0.5, 0.5, 0, 0.5], [-0.3] * 2 + [0, 0] + [-0.3] * 2 + [0, 0],
                               [0.2, 0.2, 0, 0, 0.2, 0.2, 0, 0]])
    capped, count = discredit_turns(advantages, mask, [[1], [0], []])
    assert capped.tolist() == [[0.5, 0.5, 0, 0, 0.0, 0.0, 0, 0.5], advantages[1].tolist(), advantages[2].tolist()]
    assert count == 2
    # A turn index past the row's last turn touches nothing.
    assert torch.equal(discredit_turns(advantages, mask, [[5], [], []])[0], advantages)
    with pytest.raises(ValueError, match="B turn lists"):
        discredit_turns(advantages, mask, [[1]])


def test_discredit_turns_keeps_the_credit_of_tokens_before_the_wrong_one():
    # Row 0: turns 0 (tokens 0-2) and 1 (5-7), both rejected; turn 1 went wrong at token 6, so
    # token 5 keeps its +0.5; turn 0 has no located wrong token and is capped whole.
    # Row 1: turn 0 went wrong at its first token (0): all of it is capped.
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0]])
    advantages = torch.tensor([[0.5, 0.5, 0.5, 0, 0, 0.5, 0.5, 0.5], [0.25, 0.25, 0.25, 0, 0, 0, 0, 0]])
    capped, count = discredit_turns(advantages, mask, [[0, 1], [0]], [[6], [0]])
    assert capped.tolist() == [[0, 0, 0, 0, 0, 0.5, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]]
    assert count == 5 + 3
    with pytest.raises(ValueError, match="position lists"):
        discredit_turns(advantages, mask, [[0], [0]], [[6]])


def test_penalize_tokens_subtracts_at_the_listed_positions_only():
    advantages = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, -0.25, 0.0, 0.0]])
    out = penalize_tokens(advantages, [[2], [1, 2]], penalty=0.5)
    assert out.tolist() == [[0.0, 0.5, 0.0, 0.0], [0.0, -0.75, -0.5, 0.0]]
    assert advantages[0, 2] == 0.5  # the input is not modified
    with pytest.raises(ValueError, match="penalty must be >= 0"):
        penalize_tokens(advantages, [[], []], penalty=-1.0)
    with pytest.raises(ValueError, match="2 position lists"):
        penalize_tokens(advantages, [[]], penalty=1.0)


def test_rare_action_tokens_keeps_the_actions_whose_verb_holds_at_most_the_share():
    """20 actions: "go" 17, "pickup" 2, "turn" 1. At a share of 0.1 (2 actions) "pickup" and
    "turn" are rare, "go" is not; at 0.05 (1 action) only "turn"."""
    tokens = [[3, 9], [4] * 9 + [8], [5] * 7 + [6, 7]]
    verbs = [["go", "pickup"], ["go"] * 9 + ["turn"], ["go"] * 7 + ["go", "pickup"]]
    positions, rare = rare_action_tokens(tokens, verbs, share=0.1)
    assert rare == {"pickup", "turn"}
    assert positions == [[9], [8], [7]]
    positions, rare = rare_action_tokens(tokens, verbs, share=0.05)
    assert rare == {"turn"} and positions == [[], [8], []]
    assert rare_action_tokens([[], []], [[], []], share=0.05) == ([[], []], set())
    # Counted over 4 actions, "go" and "pickup" 2 each: both rare at 0.5; "turn", rare in the
    # batch, is absent there and so not rare.
    positions, rare = rare_action_tokens(tokens, verbs, share=0.5, counted_over=[["go", "pickup"], ["pickup", "go"]])
    assert rare == {"go", "pickup"} and positions == [[3, 9], [4] * 9, [5] * 7 + [6, 7]]
    positions, rare = rare_action_tokens(tokens, verbs, share=0.25, counted_over=[["go"] * 5, ["turn"]])
    assert rare == {"turn"} and positions == [[], [8], []]
    with pytest.raises(ValueError, match="needs its verb"):
        rare_action_tokens([[1, 2]], [["go"]], share=0.05)
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\]"):
        rare_action_tokens([[1]], [["go"]], share=0.0)


# --------------------------------------------------------------------------------- GiGPO

# Group 0: two successful episodes of one task. Row 0 takes 2 turns (states s0, s1); row 1 takes
# 3 (s0, s0 again after a rejected action, then s1). Group 1: row 2 succeeds without state ids,
# row 3 fails alone in s0 (the same id as group 0's s0, which must not join its step group).
GIGPO_MASK = [[1, 1, 0, 1, 0], [1, 0, 1, 0, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
GIGPO_STATES = [[0, 0, -1, 1, -1], [0, -1, 0, -1, 1], [-1, -1, -1, -1, -1], [0, -1, -1, -1, -1]]


def gigpo(**hparams):
    return gigpo_advantages(t([1.0, 1.0, 1.0, 0.0]), ids([0, 0, 1, 1]), t(GIGPO_MASK), ids(GIGPO_STATES), **hparams)


def test_gigpo_hand_example_without_std():
    # γ = 0.5: returns from s0 in group 0 are 0.5 (row 0, turn 0), 0.25 and 0.5 (row 1, turns 0
    # and 1); their mean is 5/12, so A^S = 1/12, -1/6, 1/12. From s1 both returns are 1: A^S = 0.
    # Episode level: group 0 ties (0); group 1 is +-0.5. Row 3's s0 is alone in its group: 0.
    out = gigpo(normalize_std=False, gamma=0.5)
    assert_rows(out.advantages, [[1 / 12, 1 / 12, 0, 0, 0], [-1 / 6, 0, 1 / 12, 0, 0],
                                 [0.5, 0.5, 0, 0, 0], [-0.5, 0, 0, 0, 0]])
    assert out.metrics["keyed_turn_frac"] == pytest.approx(6 / 7)
    assert out.metrics["step_groups"] == 2.0
    assert out.metrics["step_grouped_turn_frac"] == pytest.approx(5 / 7)
    assert out.metrics["zero_var_group_frac"] == 0.5
    # ω scales the step level only.
    doubled = gigpo(normalize_std=False, gamma=0.5, step_weight=2.0)
    assert_rows(doubled.advantages[:2], [[1 / 6, 1 / 6, 0, 0, 0], [-1 / 3, 0, 1 / 6, 0, 0]])


def test_gigpo_hand_example_with_std():
    # The s0 step group's deviations 1/12, -1/6, 1/12 have an unbiased std of sqrt(1/48), so
    # A^S = 1/sqrt(3), -2/sqrt(3), 1/sqrt(3); group 1's episode std is sqrt(1/2): A^E = +-sqrt(1/2).
    out = gigpo(normalize_std=True, gamma=0.5)
    a, h = 1 / math.sqrt(3), math.sqrt(0.5)
    assert_rows(out.advantages, [[a, a, 0, 0, 0], [-2 * a, 0, a, 0, 0], [h, h, 0, 0, 0], [-h, 0, 0, 0, 0]],
                atol=1e-5)


def test_gigpo_credits_the_detour_where_grpo_gives_nothing():
    # Both episodes of group 0 succeed: GRPO (and GiGPO without states, or with γ = 1, where
    # every return from a state is the same) has no signal; GiGPO blames the turn that went
    # nowhere (row 1's first) and credits the ones that moved on.
    rewards, groups, mask = t([1.0, 1.0]), ids([0, 0]), t(GIGPO_MASK[:2])
    grpo = broadcast_to_tokens(grpo_advantages(rewards, groups).advantages, mask)
    assert not grpo.any()
    assert torch.equal(gigpo_advantages(rewards, groups, mask).advantages, grpo)
    assert not gigpo_advantages(rewards, groups, mask, ids(GIGPO_STATES[:2]), gamma=1.0).advantages.any()
    step = gigpo_advantages(rewards, groups, mask, ids(GIGPO_STATES[:2]), gamma=0.95).advantages
    assert step[1, 0] < 0 < step[1, 2] and step[0, 0] > 0


def test_gigpo_without_states_is_grpo_and_rejects_bad_inputs():
    rewards, groups, mask = t([1.0, 0.0, 0.5]), ids([0, 0, 0]), t([MASK, MASK, MASK])
    expected = broadcast_to_tokens(grpo_advantages(rewards, groups).advantages, mask)
    assert torch.allclose(compute_advantages("gigpo", {"rewards": rewards, "group_ids": groups, "mask": mask})
                          .advantages, expected)
    assert advantage_inputs("gigpo") == (("rewards", "group_ids", "mask"), ("state_ids", "turn_rewards"),
                                         ("normalize_std", "step_weight", "gamma", "eps"))
    with pytest.raises(ValueError, match="state_ids shape"):
        gigpo_advantages(rewards, groups, mask, ids([[0, 1]] * 3))
    with pytest.raises(ValueError, match="integer"):
        gigpo_advantages(rewards, groups, mask, t([[0.0] * 7] * 3))
    with pytest.raises(ValueError, match="gamma"):
        gigpo_advantages(rewards, groups, mask, gamma=1.5)
    empty = gigpo_advantages(t([]), ids([]), torch.zeros(0, 4))
    assert empty.advantages.shape == (0, 4)


def test_gigpo_step_returns_count_each_turns_reward_where_it_was_earned():
    """Two episodes of one task, two turns each, both turn 0s from state 0 (a step group), the
    turn 1s from states 1 and 2 (alone). Episode A: −0.1 (a penalised turn), then 1.0; B: 0.0,
    then 1.0. γ = 0.5, no std. Turn 0's returns: A −0.1 + 0.5 · 1.0 = 0.4, B 0.5 → step
    advantages −0.05, +0.05. Without the turns' rewards, the total (0.9, 1.0) arrives after the
    last turn: 0.45 and 0.5 → −0.025, +0.025, the penalty discounted as if it came at the end."""
    rewards = torch.tensor([0.9, 1.0])
    groups = torch.tensor([0, 0])
    mask = torch.tensor([[1, 0, 1], [1, 0, 1]])
    states = torch.tensor([[0, -1, 1], [0, -1, 2]])
    turn_rewards = torch.tensor([[-0.1, 1.0], [0.0, 1.0]])
    kwargs = dict(normalize_std=False, gamma=0.5, step_weight=1.0)
    per_turn = gigpo_advantages(rewards, groups, mask, states, turn_rewards, **kwargs).advantages
    episode = torch.tensor([-0.05, 0.05])  # GRPO's (0.9 and 1.0 about their mean 0.95)
    assert per_turn[:, 0].tolist() == pytest.approx((episode + torch.tensor([-0.05, 0.05])).tolist())
    assert per_turn[:, 2].tolist() == pytest.approx(episode.tolist())  # turn 1s: step groups of one
    at_end = gigpo_advantages(rewards, groups, mask, states, **kwargs).advantages
    assert at_end[:, 0].tolist() == pytest.approx((episode + torch.tensor([-0.025, 0.025])).tolist())
