"""The RL objective (`algos.objective`): its terms by hand, each switched off, TIS inside it,
and the settings of a recipe reaching every function by keyword."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from agentgym_rl.algos import LOSS, SPEC_FIELDS, TERMS, get_algorithm, rl_objective

LN2 = math.log(2)


def inputs(**changes):
    """One row of three tokens, the last off the mask. Ratios are 1 (logprobs = old), so the
    policy term is −mean(A) = −(1 + 2)/2 = −1.5. The reference finds each token half as likely:
    k3 = q/p − 1 − log(q/p) = 0.5 − 1 + ln 2. Values 1 against returns 0 and 2 (unclipped, as
    old values = values): ½·mean((V − R)²) = 0.5. Entropy 1 and 3: the bonus term is −2. The right
    continuations have probability ½ at the second token: −ln ½ = ln 2."""
    logprobs = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    values = torch.tensor([[1.0, 1.0, 0.0]], requires_grad=True)
    base = {"logprobs": logprobs, "old_logprobs": logprobs.detach().clone(),
            "advantages": torch.tensor([[1.0, 2.0, 0.0]]),
            "mask": torch.tensor([[1.0, 1.0, 0.0]]), "ref_logprobs": logprobs.detach() - LN2,
            "values": values, "old_values": values.detach().clone(), "returns": torch.tensor([[0.0, 2.0, 0.0]]),
            "entropy": torch.tensor([[1.0, 3.0, 0.0]], requires_grad=True),
            "right_logprobs": torch.tensor([[0.0, -LN2, 0.0]]), "right_mask": torch.tensor([[0, 1, 0]])}
    return {**base, **changes}


K3 = 0.5 - 1 + LN2


def test_every_term_by_hand():
    spec = dataclasses.replace(get_algorithm("ppo"), value_coef=0.5, kl_coef=0.1, right_token_coef=2.0,
                               entropy_coef=0.01)
    loss, metrics = rl_objective(spec, inputs())
    assert loss.item() == pytest.approx(-1.5 + 0.5 * 0.5 + 0.1 * K3 + 2.0 * LN2 + 0.01 * -2.0, abs=1e-6)
    assert metrics["value_loss"] == pytest.approx(0.5) and metrics["kl"] == pytest.approx(K3, abs=1e-6)
    assert metrics["right_token_loss"] == pytest.approx(LN2) and metrics["entropy"] == pytest.approx(2.0)
    loss.backward()  # every term with gradient reaches its tensor


@pytest.mark.parametrize("off,without", [
    ({"value_coef": 0.0}, 0.5 * 0.5), ({"kl_coef": 0.0}, 0.1 * K3), ({"right_token_coef": 0.0}, 2.0 * LN2),
    ({"entropy_coef": 0.0}, 0.01 * -2.0)])
def test_a_term_switched_off_leaves_the_total(off, without):
    spec = dataclasses.replace(get_algorithm("ppo"), value_coef=0.5, kl_coef=0.1, right_token_coef=2.0,
                               entropy_coef=0.01)
    full = rl_objective(spec, inputs())[0].item()
    assert rl_objective(dataclasses.replace(spec, **off), inputs())[0].item() == pytest.approx(full - without, abs=1e-6)


def test_the_recipe_decides_the_terms():
    # grpo: no critic, so no value term even with the tensors given; its β = 1e-3 KL is a loss.
    loss, metrics = rl_objective(get_algorithm("grpo"), inputs())
    assert "value_loss" not in metrics and "entropy" not in metrics
    assert loss.item() == pytest.approx(-1.5 + 1e-3 * K3, abs=1e-6)
    # reinforce++ folds the KL into the reward: measured (its estimator k1 = log p − log q = ln 2),
    # not added again.
    loss, metrics = rl_objective(get_algorithm("reinforce++"), inputs())
    assert metrics["kl"] == pytest.approx(LN2, abs=1e-6) and loss.item() == pytest.approx(-1.5, abs=1e-6)
    # An input a term needs is named when it is missing; an unknown input is refused.
    with pytest.raises(ValueError, match="'value_clip' needs input.*'returns'"):
        rl_objective(get_algorithm("ppo"), inputs(returns=None))
    with pytest.raises(ValueError, match="unknown objective input.*'advantage'"):
        rl_objective(get_algorithm("grpo"), {**inputs(), "advantage": torch.zeros(1, 3)})


def test_truncated_importance_sampling_weights_the_policy_term():
    # The generator found the first token half as likely as the learner does: weight min(2, 1.5)
    # = 1.5 on A = 1, 1 on A = 2: −(1.5·1 + 1·2)/2 = −1.75. Without a cap: −1.5.
    spec = dataclasses.replace(get_algorithm("grpo"), kl_coef=0.0, tis_cap=1.5)
    generator = torch.tensor([[-1.0 - LN2, -2.0, 0.0]])
    loss, metrics = rl_objective(spec, inputs(generator_logprobs=generator))
    assert loss.item() == pytest.approx(-1.75, abs=1e-6) and metrics["tis_weight_mean"] == pytest.approx(1.25)
    untouched = rl_objective(dataclasses.replace(spec, tis_cap=None), inputs(generator_logprobs=generator))[0]
    assert untouched.item() == pytest.approx(-1.5, abs=1e-6)


def test_each_loss_keyword_named_like_a_setting_gets_the_recipes_value(monkeypatch):
    """The convention that makes a new hyper-parameter one line: a loss function's keyword with
    the name of an `AlgorithmSpec` setting receives the recipe's value."""
    seen = {}

    def policy(logprobs, advantages, mask, *, clip_eps=9.0, epochs=9, not_a_setting=3):
        seen.update(clip_eps=clip_eps, epochs=epochs, not_a_setting=not_a_setting)
        return -(logprobs * advantages * mask).sum(), {}

    monkeypatch.setitem(LOSS, "test_policy", policy)
    spec = dataclasses.replace(get_algorithm("loop"), policy_loss="test_policy")
    rl_objective(spec, inputs())
    assert seen == {"clip_eps": 0.1, "epochs": 2, "not_a_setting": 3}
    assert {"clip_eps", "epochs"} <= SPEC_FIELDS and "not_a_setting" not in SPEC_FIELDS
    assert len(TERMS) == 5
