"""The RL trainer's update against a loss written out by hand.

`RLTrainer.update` is fed four hand-made trajectories whose advantages are known, and the
gradients it leaves in `param.grad` are compared with the gradient of

    loss = policy + value_coef · value + β · KL − entropy_coef · entropy

computed here in a few lines of torch. PPO with γ = λ = 1, no whitening and a value head
that starts at zero (as the Learner's does) makes every action token's advantage and value
target simply its trajectory's reward R, so each term is hand-checkable:

    policy  = −mean_t A_t · ρ_t          (ρ = 1 on the first, on-policy minibatch: no clipping)
    value   = ½ · mean_t (V_t − R)²      (V = V_old = 0: the value clip is inactive)
    KL      = mean_t k3(log π_ref − log π) (a reference from another seed, so it has a gradient)
    entropy = mean_t H(π(· | prefix))

(means over the action tokens of the batch: the "token-mean" aggregation of ppo). The
Learner zeroes the gradients when an update starts and leaves them (clipped in place) after
the optimizer step, so they can be read afterwards; gradients are compared rather than
AdamW-updated weights, which would turn float noise in small gradients into ±lr.
"""

from __future__ import annotations

import pytest
import torch

from agentgym_rl.agent.tiny import build_model
from agentgym_rl.config import RLConfig, TinyModelConfig, load_config
from agentgym_rl.rollout.trajectory import Trajectory
from agentgym_rl.train.batch import collate
from agentgym_rl.train.learner import Learner
from agentgym_rl.train.rl import RLTrainer

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                        max_positions=64)
# A freshly initialised model predicts an almost uniform distribution, where the entropy's
# gradient vanishes; scaling the (tied) embeddings sharpens it (entropies ~2-4 nats of 5.9).
SHARPEN = 10.0
VALUE_COEF, KL_COEF, ENTROPY_COEF = 0.5, 0.2, 0.05

# (token ids, loss mask, turn rewards): two turns; one turn; a third row; and a row with
# R = 0 (advantage 0: it enters only through the value, KL and entropy terms). Rows of
# different lengths, so the batch is padded, and micro-batches of 2 rows accumulate.
ROWS = [
    ([5, 6, 7, 8, 9, 10, 11], [0, 1, 1, 0, 0, 1, 1], [0.0, 1.0]),
    ([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], [-0.5]),
    ([12, 13, 14, 15], [0, 0, 1, 1], [0.25]),
    ([16, 17, 18], [0, 1, 1], [0.0]),
]
REL_TOL = 1e-4
"""Relative error (global L2 norm) allowed between the trainer's gradient and ours."""


def _model(tokenizer, seed: int):
    model = build_model(tokenizer, SMALL, seed=seed)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(SHARPEN)
    return model


def _trajectories(behaviour_logprob: float = -1.0) -> list[Trajectory]:
    return [Trajectory("counter", f"counter_{i}", "goal1", group=i, input_ids=ids, loss_mask=mask,
                       logprobs=[behaviour_logprob * m for m in mask], turn_rewards=rewards)
            for i, (ids, mask, rewards) in enumerate(ROWS)]


def _trainer(tmp_path, tokenizer, *overrides: str) -> RLTrainer:
    """A ppo RLTrainer set up by hand as `RLTrainer._setup` would, without a run folder:
    the policy (seed 0) in a Learner with a value head and entropies, a frozen reference
    from another seed (seed 1), and the tokenizer."""
    config = load_config(RLConfig, None, [
        "env.id=counter", f"run.output_dir={tmp_path}", "run.name=update", "algo.name=ppo",
        "algo.gamma=1", "algo.lam=1", "algo.whiten=false", f"algo.value_coef={VALUE_COEF}",
        f"algo.kl_coef={KL_COEF}", f"algo.entropy_coef={ENTROPY_COEF}", "optim.micro_batch_size=2", *overrides])
    trainer = RLTrainer(config, log=lambda _: None)
    assert trainer.algorithm.needs_critic and not trainer.algorithm.kl_in_reward
    assert trainer.algorithm.aggregation == "token-mean" and trainer.algorithm.epochs == 1
    trainer.tokenizer = tokenizer
    trainer.learner = Learner(_model(tokenizer, seed=0), config.optim, value_head=True,
                              entropy=config.algo.entropy_coef > 0, temperature=config.algo.temperature)
    trainer.reference = _model(tokenizer, seed=1).eval().requires_grad_(False)
    return trainer


def _expected_terms(trainer: RLTrainer) -> dict[str, torch.Tensor]:
    """The four loss terms of the batch `ROWS`, by hand, with gradients to the learner's parameters."""
    learner, pad = trainer.learner, trainer.tokenizer.pad_token_id
    width = max(len(ids) for ids, _, _ in ROWS)
    ids = torch.tensor([row + [pad] * (width - len(row)) for row, _, _ in ROWS])
    attention = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row, _, _ in ROWS])
    # Token t is predicted at position t − 1: drop the first column of the masks.
    mask = torch.tensor([m + [0] * (width - len(m)) for _, m, _ in ROWS], dtype=torch.float)[:, 1:]
    reward = torch.tensor([sum(r) for _, _, r in ROWS])[:, None]
    n = mask.sum()

    out = learner.model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
    logp_all = torch.log_softmax(out.logits[:, :-1].float(), -1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    with torch.no_grad():
        ref_all = torch.log_softmax(trainer.reference(input_ids=ids, attention_mask=attention).logits[:, :-1], -1)
        ref = ref_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    values = learner.value_head(out.hidden_states[-1][:, :-1].float()).squeeze(-1)

    advantage = reward * mask  # GAE with γ = λ = 1 and V = 0: A_t = R on every action token
    ratio = torch.exp(logp - logp.detach())  # π/π_old with π_old = π (value 1, gradient ∇ log π)
    log_q_over_p = ref - logp
    return {
        "policy": -(advantage * ratio * mask).sum() / n,
        "value": 0.5 * (((values - reward) ** 2) * mask).sum() / n,
        "kl": ((torch.exp(log_q_over_p) - 1 - log_q_over_p) * mask).sum() / n,
        "entropy": (-(logp_all.exp() * logp_all).sum(-1) * mask).sum() / n,
    }


COEFFICIENTS = {"policy": 1.0, "value": VALUE_COEF, "kl": KL_COEF, "entropy": -ENTROPY_COEF}
"""Sign and weight of each term in the total loss; the entropy is a bonus (minus a loss)."""


def _flat_grads(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, grads)])


def _expected(trainer: RLTrainer) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """(each term's value, each term's signed, weighted gradient), flattened over
    `learner.parameters()`; computed before the update, which moves the weights."""
    params = trainer.learner.parameters()
    terms = _expected_terms(trainer)
    return ({k: v.item() for k, v in terms.items()},
            {k: COEFFICIENTS[k] * _flat_grads(v, params) for k, v in terms.items()})


def _trainer_grads(trainer: RLTrainer) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in trainer.learner.parameters()])


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


def test_update_gradient_is_the_signed_weighted_sum_of_policy_value_kl_and_entropy(
        tmp_path, tiny_tokenizer, counter_env_registered):
    """The gradient the update leaves equals ∇(policy + c_v·value + β·KL − c_e·entropy).

    Guards against a flipped sign or a wrong coefficient of any term (e.g. `loss - value_coef
    * value_loss`, `loss - β * kl`, `loss - entropy_coef * bonus`): each term is first shown
    to move the gradient by far more than the tolerance if its sign flipped, so such a
    mutation cannot hide in float noise. With grad_clip=0 nothing rescales the gradient."""
    trainer = _trainer(tmp_path, tiny_tokenizer, "optim.grad_clip=0")
    values, grads = _expected(trainer)
    expected = sum(grads.values())
    for name, grad in grads.items():
        # Flipping this term's sign changes the gradient by 2·|its gradient|: ≥ 100× the tolerance.
        assert 2 * grad.norm() / expected.norm() > 100 * REL_TOL, name

    metrics = trainer.update(_trajectories(), step=0)

    assert metrics["update/trajectories"] == len(ROWS)
    assert metrics["update/skipped_steps"] == 0
    # The gradient of the whole loss (the value head's comes from the value term alone).
    assert _relative_error(_trainer_grads(trainer), expected) < REL_TOL
    assert metrics["update/grad_norm"] == pytest.approx(float(expected.norm()), rel=1e-4)
    # The loss value: each coefficient with its sign (the value, KL and entropy are all > 0).
    total = sum(COEFFICIENTS[k] * v for k, v in values.items())
    assert metrics["update/loss"] == pytest.approx(total, rel=1e-4, abs=1e-6)
    # The terms the trainer reports are the ones written above, on-policy (ratio 1, no clipping).
    assert metrics["update/value_loss"] == pytest.approx(values["value"], rel=1e-4)
    assert metrics["update/kl"] == pytest.approx(values["kl"], rel=1e-4)
    assert metrics["update/entropy"] == pytest.approx(values["entropy"], rel=1e-4)
    assert metrics["update/ratio_mean"] == pytest.approx(1.0, abs=1e-5)


def test_update_clips_the_gradient_norm_to_grad_clip(tmp_path, tiny_tokenizer, counter_env_registered):
    """With optim.grad_clip below the raw gradient norm, the gradient the optimizer steps
    with is the raw one scaled to norm grad_clip (same direction); the metric grad_norm is
    the norm before clipping. Guards against ignoring grad_clip (e.g. clip_grad_norm_ with inf)."""
    clip = 1e-3
    trainer = _trainer(tmp_path, tiny_tokenizer, f"optim.grad_clip={clip}")
    expected = sum(_expected(trainer)[1].values())
    raw_norm = float(expected.norm())
    assert raw_norm > 10 * clip  # the clip must bind

    metrics = trainer.update(_trajectories(), step=0)

    actual = _trainer_grads(trainer)
    assert metrics["update/grad_norm"] == pytest.approx(raw_norm, rel=1e-4)
    assert float(actual.norm()) == pytest.approx(clip, rel=1e-4)
    assert _relative_error(actual, expected * (clip / raw_norm)) < REL_TOL


@pytest.mark.parametrize("max_kl,skipped", [(1.0, True), (100.0, False), (0.0, False)])
def test_max_kl_guard_leaves_the_weights_bit_identical(tmp_path, tiny_tokenizer, counter_env_registered,
                                                       max_kl, skipped):
    """The behaviour logprobs say the sampler was sure (log π_old = 0) while the policy
    gives its tokens ~−6, so the approximate KL mean(log π_old − log π) is ~6 nats: above
    max_kl=1 the step is skipped, and the weights (value head included) must be bit-identical
    and AdamW's state untouched; with a guard that does not trigger (100) or none (0) the
    same update moves them. Guards against stepping the optimizer on a skipped step."""
    trainer = _trainer(tmp_path, tiny_tokenizer, f"algo.max_kl={max_kl}", "algo.recompute_old_logprobs=false")
    before = [p.detach().clone() for p in trainer.learner.parameters()]

    metrics = trainer.update(_trajectories(behaviour_logprob=0.0), step=0)

    assert metrics["update/approx_kl"] > 4.0
    assert metrics["update/skipped_steps"] == float(skipped)
    # The gradients were computed either way (the guard drops only the step).
    assert _trainer_grads(trainer).norm() > 0
    after = list(trainer.learner.parameters())
    if skipped:
        assert all(torch.equal(a, b) for a, b in zip(before, after))
        assert not trainer.learner.optimizer.state
    else:
        assert any(not torch.equal(a, b) for a, b in zip(before, after))


def _grpo_trainer(tmp_path, tokenizer, *overrides: str) -> RLTrainer:
    """A GRPO RLTrainer (no critic, no KL) around the seed-0 policy, set up by hand."""
    config = load_config(RLConfig, None, ["env.id=counter", f"run.output_dir={tmp_path}", "run.name=update",
                                          "algo.name=grpo", "algo.kl_coef=0", "optim.grad_clip=0", *overrides])
    trainer = RLTrainer(config, log=lambda _: None)
    trainer.tokenizer = tokenizer
    trainer.learner = Learner(_model(tokenizer, seed=0), config.optim, temperature=config.algo.temperature)
    return trainer


def _grouped(logprobs: list[list[float]] | None = None) -> list[Trajectory]:
    """`ROWS` as two groups of two, each with a reward spread; behaviour logprobs -1 (or given)."""
    return [Trajectory("counter", f"counter_{i}", "goal1", group=i // 2, input_ids=ids, loss_mask=mask,
                       logprobs=logprobs[i] if logprobs else [-1.0 * m for m in mask], turn_rewards=rewards)
            for i, (ids, mask, rewards) in enumerate(ROWS)]


def test_a_one_step_update_reads_its_old_logprobs_from_its_own_forward_pass(tmp_path, tiny_tokenizer,
                                                                           counter_env_registered):
    """GRPO whose update is one optimizer step (one epoch, every row in one minibatch) takes the
    old logprobs from that step's own forward pass, detached: no scoring pass of its own runs,
    and the gradient is the one of an update handed the learner's exact logprobs as the
    behaviour policy's (`recompute_old_logprobs: false`). Taking the generator's logprobs (-1
    here, far from the model's) instead would clip every token's ratio and change it. Split
    into two minibatches, the update scores the rows first."""
    fused = _grpo_trainer(tmp_path, tiny_tokenizer)
    own = fused.learner.logprobs(collate(_grouped(), tiny_tokenizer.pad_token_id))
    calls = []
    scoring = fused.learner.outputs
    fused.learner.outputs = lambda *args, **kwargs: calls.append(1) or scoring(*args, **kwargs)
    given = _grpo_trainer(tmp_path, tiny_tokenizer, "algo.recompute_old_logprobs=false")

    metrics = fused.update(_grouped(), step=0)
    reference = given.update(_grouped([row[:len(ids)].tolist() for row, (ids, _, _) in zip(own, ROWS)]), step=0)

    assert calls == [] and metrics["update/optimizer_steps"] == 1 and metrics["update/trajectories"] == 4
    assert metrics["update/ratio_mean"] == 1.0 and metrics["update/clip_fraction"] == 0.0
    assert metrics["rollout/logprob_gap_mean"] > 1.0  # the generator's -1 against the model's ~-6
    assert _relative_error(_trainer_grads(fused), _trainer_grads(given)) < REL_TOL
    assert metrics["update/loss"] == pytest.approx(reference["update/loss"], rel=1e-5)

    split = _grpo_trainer(tmp_path, tiny_tokenizer, "algo.minibatch_size=2")
    calls_split = []
    scoring_split = split.learner.outputs
    split.learner.outputs = lambda *args, **kwargs: calls_split.append(1) or scoring_split(*args, **kwargs)
    assert split.update(_grouped(), step=0)["update/optimizer_steps"] == 2 and calls_split == [1]
