"""The Learner: logprob alignment and micro-batch accumulation equal to a full-batch step."""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from agentgym_rl.rollout.trajectory import Trajectory
from agentgym_rl.train.batch import collate, micro_batches, turn_state_ids
from agentgym_rl.train.learner import (Learner, OptimConfig, is_right_padded, token_logprobs,
                                      token_outputs)
from agentgym_rl.train.finetune import nll_loss

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                        max_positions=64)


def present(out) -> dict:
    """The outputs `token_outputs` gave, by name."""
    return {name: value for name, value in vars(out).items() if value is not None}


def _batch(tokenizer):
    rows = [[5, 6, 7, 8, 9], [5, 6, 7], [10, 11, 12, 13], [14, 15]]
    masks = [[0, 0, 1, 1, 1], [0, 1, 1], [0, 0, 0, 1], [0, 1]]
    return collate([Trajectory("e", f"e_{i}", "c", input_ids=r, loss_mask=m) for i, (r, m) in enumerate(zip(rows, masks))],
                   tokenizer.pad_token_id)


def test_token_logprobs_are_aligned_with_the_predicted_token(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SMALL)
    batch = _batch(tiny_tokenizer)
    out = token_logprobs(model, batch)
    logits = model(input_ids=batch.input_ids[:1, :3]).logits
    expected = torch.log_softmax(logits[0, 1], -1)[batch.input_ids[0, 2]]
    assert out[0, 0] == 0 and torch.allclose(out[0, 2], expected, atol=1e-5)


def test_a_right_padded_batch_is_scored_as_each_row_alone(tiny_tokenizer):
    """collate right-pads, so the learner drops the attention mask (a faster SDPA kernel):
    every real token's logprob must still be that of its row run alone, unpadded."""
    model = build_model(tiny_tokenizer, SMALL).eval()
    batch = _batch(tiny_tokenizer)
    with torch.no_grad():
        scored = token_logprobs(model, batch)
        for row, length in enumerate(batch.attention_mask.sum(1).tolist()):
            alone = token_logprobs(model, batch.select([row]))
            assert torch.allclose(scored[row, :length], alone[0], atol=1e-5)


def test_turn_state_ids_number_each_turns_state_key_across_the_batch():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0]])
    rows = [Trajectory("e", "e_0", "c", state_keys=["a", "b"]), Trajectory("e", "e_1", "c", state_keys=["b", "", "a"]),
            Trajectory("e", "e_2", "c")]  # no key recorded: -1
    assert turn_state_ids(rows, mask).tolist() == [[-1, 0, 0, -1, 1, -1], [-1, 1, -1, -1, -1, 0],
                                                   [-1, -1, -1, -1, -1, -1]]


def test_right_logprobs_are_the_log_total_probability_of_the_listed_tokens(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SMALL)
    trajectories = [Trajectory("e", "e_0", "c", input_ids=[5, 6, 7, 8, 9], loss_mask=[0, 0, 1, 1, 1],
                               wrong_tokens=[3], right_tokens=[[20, 21]]),
                    Trajectory("e", "e_1", "c", input_ids=[5, 6, 7], loss_mask=[0, 1, 1])]
    batch = collate(trajectories, tiny_tokenizer.pad_token_id, right_tokens=True)
    assert batch.right_ids.shape == (2, 5, 2) and batch.right_ids[0, 3].tolist() == [20, 21]
    out = token_outputs(model, batch)
    probs = torch.softmax(model(input_ids=batch.input_ids[:1, :3]).logits[0, 2], -1)  # predicts token 3
    assert torch.allclose(out.right_logprobs[0, 3], (probs[20] + probs[21]).log(), atol=1e-5)
    # Elsewhere 0, and no NaN flows back from the positions that list nothing.
    assert out.right_logprobs[0, :3].eq(0).all() and out.right_logprobs[1].eq(0).all()
    out.right_logprobs.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_only_masks_of_ones_then_zeros_count_as_right_padded():
    assert is_right_padded(torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]))
    assert not is_right_padded(torch.tensor([[1, 1, 1], [0, 1, 1]]))  # left padding
    assert not is_right_padded(torch.tensor([[1, 0, 1]]))  # a hole in the middle


def test_micro_batches_accumulate_to_the_full_batch_step(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SMALL)
    twin = copy.deepcopy(model)
    batch = _batch(tiny_tokenizer)
    full = Learner(model, OptimConfig(lr=0.1, micro_batch_size=4, grad_clip=0))
    micro = Learner(twin, OptimConfig(lr=0.1, micro_batch_size=1, grad_clip=0))
    loss_full = full.update(batch, nll_loss)["loss"]
    loss_micro = micro.update(batch, nll_loss)["loss"]
    assert abs(loss_full - loss_micro) < 1e-5
    # The accumulated gradients (left in .grad after the step) match; comparing weights after
    # Adam would amplify float noise in near-zero gradients to ±lr.
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
    # and the step did change the weights
    fresh = build_model(tiny_tokenizer, SMALL)
    assert any(not torch.allclose(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_a_mean_over_rows_adds_up_across_micro_batches_weighed_by_tokens(tiny_tokenizer):
    """The right-token term is a mean over rows, while a token-mean objective has the learner
    weigh each micro-batch by its share of loss tokens: `row_weights` make four micro-batches of
    one row (1, 2, 3 and 5 loss tokens) give the gradient of one batch of the four."""
    from agentgym_rl.algos import right_token_loss

    rows = [([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], 3), ([5, 6, 7], [0, 1, 1], 2), ([10, 11, 12, 13], [0, 0, 0, 1], 3),
            ([14, 15, 16, 17, 18, 19], [0, 1, 1, 1, 1, 1], 4)]
    batch = collate([Trajectory("e", f"e_{i}", "c", input_ids=ids, loss_mask=mask, wrong_tokens=[wrong],
                                right_tokens=[[20, 21]]) for i, (ids, mask, wrong) in enumerate(rows)],
                    tiny_tokenizer.pad_token_id, right_tokens=True)

    def gradients(micro_batch_size: int, weighed: bool) -> list[torch.Tensor]:
        model = build_model(tiny_tokenizer, SMALL)  # the same weights every time (seeded)
        learner = Learner(model, OptimConfig(lr=0.1, micro_batch_size=micro_batch_size, grad_clip=0))
        learner.update(batch, lambda micro, out: right_token_loss(
            out.right_logprobs, micro.right_token_positions(), micro.row_weights if weighed else None), "tokens")
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole = gradients(4, True)
    for split, expected in zip(gradients(1, True), whole):
        assert torch.allclose(split, expected, atol=1e-6)
    # Each micro-batch's plain mean over its own rows, scaled by its share of tokens, is another gradient.
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(gradients(1, False), whole))


def test_the_heap_is_handed_back_after_each_micro_batch_backward(tiny_tokenizer, monkeypatch):
    """What one micro-batch freed is not kept for the next (glibc fragments it otherwise)."""
    model = build_model(tiny_tokenizer, SMALL)
    learner = Learner(model, OptimConfig(lr=0.1, micro_batch_size=1, grad_clip=0))
    gradients_at_release = []
    monkeypatch.setattr("agentgym_rl.train.learner.release_free_memory",
                        lambda: gradients_at_release.append(sum(p.grad is not None for p in model.parameters())))
    learner.update(_batch(tiny_tokenizer), nll_loss)
    assert len(gradients_at_release) == 4  # one per row
    assert all(count > 0 for count in gradients_at_release)  # each after its backward pass


def test_a_kl_guard_on_a_metric_the_loss_does_not_report_is_refused(tiny_tokenizer):
    """`algo.max_kl` reads the policy loss's approx_kl: with a loss that reports none, it would
    never skip a step, silently; it is an error instead, and the weights are left as they were."""
    from agentgym_rl.errors import UserError

    model = build_model(tiny_tokenizer, SMALL)
    learner = Learner(model, OptimConfig(lr=0.1, micro_batch_size=2, grad_clip=0))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(UserError, match="algo.max_kl"):
        learner.update(_batch(tiny_tokenizer), nll_loss, skip_above=("approx_kl", 0.05))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_micro_batches_group_rows_by_length_and_scores_keep_row_order(tiny_tokenizer):
    batch = _batch(tiny_tokenizer)  # row lengths 5, 3, 4, 2
    assert [rows for rows, _ in micro_batches(batch, 2)] == [[3, 1], [2, 0]]
    assert [micro.input_ids.shape[1] for _, micro in micro_batches(batch, 2)] == [3, 5]
    model = build_model(tiny_tokenizer, SMALL).eval()
    scored = Learner(model, OptimConfig(micro_batch_size=2)).logprobs(batch)
    with torch.no_grad():
        whole = token_logprobs(model, batch) * batch.loss_mask  # the learner scores the loss mask only
    assert torch.equal(scored == 0, batch.loss_mask == 0) and torch.allclose(scored, whole, atol=1e-5)


def test_learner_scores_the_tempered_policy_that_sampled_the_rollout(tiny_tokenizer):
    """The generator's behaviour logprobs at temperature 0.5 are the learner's at 0.5 (so PPO's
    ratio starts at 1), and not the untempered ones."""
    from agentgym_rl.agent.generator import HFGenerator

    model = build_model(tiny_tokenizer, SMALL).eval()
    with torch.no_grad():  # sharper logits than the default init, so temperature matters
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    prompt = tiny_tokenizer.encode("Your goal: go to the red ball.")
    torch.manual_seed(0)
    generation = HFGenerator(model, tiny_tokenizer.pad_token_id, [], 0.5).generate([prompt], 6)[0]
    ids = prompt + generation.ids
    batch = collate([Trajectory("e", "e_0", "c", input_ids=ids, loss_mask=[0] * len(prompt) + [1] * 6)],
                    tiny_tokenizer.pad_token_id)
    tempered = Learner(model, OptimConfig(), temperature=0.5).logprobs(batch)[0, len(prompt):]
    plain = Learner(model, OptimConfig()).logprobs(batch)[0, len(prompt):]
    assert torch.allclose(tempered, torch.tensor(generation.logprobs), atol=1e-4)
    assert not torch.allclose(plain, torch.tensor(generation.logprobs), atol=1e-2)


def test_logits_made_in_chunks_score_and_train_as_logits_made_whole(tiny_tokenizer):
    """Chunked scoring (2 positions at a time, so every row spans chunks) returns the same
    logprobs, entropies, right-token logprobs and values as one full-vocabulary pass, and
    the same gradients."""
    trajectories = [Trajectory("e", "e_0", "c", input_ids=[5, 6, 7, 8, 9], loss_mask=[0, 0, 1, 1, 1],
                               wrong_tokens=[3], right_tokens=[[20, 21]]),
                    Trajectory("e", "e_1", "c", input_ids=[5, 6, 7], loss_mask=[0, 1, 1])]
    batch = collate(trajectories, tiny_tokenizer.pad_token_id, right_tokens=True)
    model = build_model(tiny_tokenizer, SMALL)
    head = torch.nn.Linear(SMALL.hidden_size, 1)
    torch.nn.init.normal_(head.weight)
    results = []
    for chunk in (None, 4 * len(tiny_tokenizer)):  # 4 logit rows over 2 rows: chunks of 2 positions
        model.zero_grad()
        out = token_outputs(model, batch, head, entropy=True, temperature=0.7, chunk=chunk)
        sum(value.sum() for value in present(out).values()).backward()
        results.append(({k: v.detach() for k, v in present(out).items()}, [p.grad.clone() for p in model.parameters()]))
    (whole, whole_grads), (chunked, chunked_grads) = results
    assert set(whole) == set(chunked) == {"logprobs", "entropy", "right_logprobs", "values"}
    for key in whole:
        assert torch.allclose(whole[key], chunked[key], atol=1e-5), key
    assert whole["right_logprobs"][0, 3] != 0 and whole["entropy"][1, 2] > 0
    for a, b in zip(whole_grads, chunked_grads):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("chunk_positions", [None, 3, 1000])
def test_scoring_only_the_wanted_positions_gives_their_outputs_and_gradients(tiny_tokenizer, chunk_positions):
    """With `positions` the output head runs on those tokens only: there the logprobs,
    entropies and right-token logprobs (and every gradient of a loss reading them) are those
    of scoring all positions; elsewhere they are 0. Values stay at every position. Chunks of
    3 positions spread the 5 wanted ones over two."""
    trajectories = [Trajectory("e", "e_0", "c", input_ids=[5, 6, 7, 8, 9], loss_mask=[0, 0, 1, 1, 1],
                               wrong_tokens=[3], right_tokens=[[20, 21]]),
                    Trajectory("e", "e_1", "c", input_ids=[5, 6, 7, 8], loss_mask=[0, 1, 0, 1]),
                    Trajectory("e", "e_2", "c", input_ids=[10, 11], loss_mask=[0, 0])]
    batch = collate(trajectories, tiny_tokenizer.pad_token_id, right_tokens=True)
    wanted = batch.loss_mask > 0
    assert int(wanted.sum()) == 5
    model = build_model(tiny_tokenizer, SMALL)
    chunk = chunk_positions and chunk_positions * model.get_output_embeddings().weight.shape[0]
    head = torch.nn.Linear(SMALL.hidden_size, 1)
    results = []
    for positions in (None, wanted):
        model.zero_grad()
        out = token_outputs(model, batch, head, entropy=True, temperature=0.7, chunk=chunk, positions=positions)
        loss = sum((value * wanted).sum() for key, value in present(out).items() if key != "values") + out.values.sum()
        loss.backward()
        results.append(({k: v.detach() for k, v in present(out).items()}, [p.grad.clone() for p in model.parameters()]))
    (every, every_grads), (some, some_grads) = results
    for key in ("logprobs", "entropy", "right_logprobs"):
        assert torch.allclose(every[key] * wanted, some[key], atol=1e-6), key
        assert some[key][~wanted].eq(0).all(), key
    others = ~wanted & (batch.attention_mask > 0)
    assert every["logprobs"][:, 1:][others[:, 1:]].ne(0).all()  # scoring all positions did score them
    assert torch.allclose(every["values"], some["values"], atol=1e-6)
    for a, b in zip(every_grads, some_grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_micro_batches_cap_token_cells_and_keep_groups_whole_and_in_order(tiny_tokenizer):
    batch = _batch(tiny_tokenizer)  # row lengths 5, 3, 4, 2
    # At most 8 cells: rows 3 and 1 (2 x 3 = 6), then row 2 alone (adding row 0 gives 2 x 5).
    assert [rows for rows, _ in micro_batches(batch, 4, max_tokens=8)] == [[3, 1], [2], [0]]
    # A row wider than the cap still gets a micro-batch of its own.
    assert [rows for rows, _ in micro_batches(batch, 4, max_tokens=3)] == [[3], [1], [2], [0]]
    # Groups of two (DPO's chosen, rejected): pairs (0, 1) of width 5 and (2, 3) of width 4.
    assert [rows for rows, _ in micro_batches(batch, 2, group=2)] == [[2, 3], [0, 1]]
    assert [rows for rows, _ in micro_batches(batch, 4, group=2)] == [[2, 3, 0, 1]]
    assert [rows for rows, _ in micro_batches(batch, 4, max_tokens=9, group=2)] == [[2, 3], [0, 1]]


def test_a_pair_loss_sees_its_pairs_whole_in_every_micro_batch(tiny_tokenizer):
    """DPO's rows are chosen, rejected, chosen, rejected: sorted by length one at a time, a
    micro-batch paired one pair's rejected row with another's chosen (a silently wrong loss)."""
    from agentgym_rl.algos import dpo_loss, sequence_logprob
    from agentgym_rl.train.dpo import make_loss

    batch = _batch(tiny_tokenizer)  # pairs (5, 3) and (4, 2) tokens
    batch.ref_sequence_logprobs = torch.tensor([-3.0, -2.0, -4.0, -1.0])
    model = build_model(tiny_tokenizer, SMALL)
    with torch.no_grad():
        policy = sequence_logprob(token_logprobs(model, batch), batch.loss_mask)
        ref = batch.ref_sequence_logprobs
        expected = dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], beta=0.1)[0].item()
    learner = Learner(model, OptimConfig(micro_batch_size=2))
    got = learner.update(batch, make_loss(0.1, 0.0), weight_by="sequences", group=2)["loss"]
    assert abs(got - expected) < 1e-5


def test_autocast_runs_the_trunk_in_bfloat16_and_keeps_scores_and_gradients_float32(tiny_tokenizer):
    """`optim.compute_dtype`: the trunk's matrix products in bfloat16 (the logprobs move by its
    rounding, not more), the output head in float32 on the trunk's output (its gradient is
    float32 and close to the float32 pass's), every parameter's gradient float32; and the
    learner resolves the setting once."""
    batch = _batch(tiny_tokenizer)
    model = build_model(tiny_tokenizer, SMALL)
    results = {}
    for dtype in (None, torch.bfloat16):
        model.zero_grad()
        seen = []
        hooks = [module.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
                 for module in (model.get_decoder().layers[0].mlp.down_proj, model.get_output_embeddings())]
        out = token_outputs(model, batch, autocast=dtype, positions=batch.loss_mask)
        for hook in hooks:
            hook.remove()
        (out.logprobs * batch.loss_mask).sum().backward()
        results[dtype] = (seen, out.logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (plain_seen, plain, plain_grads), (cast_seen, cast, cast_grads) = results[None], results[torch.bfloat16]
    # A layer of the trunk first; last the output head that scores (after the trunk: outside
    # autocast; the model's own forward also runs its head, on one position, which is unused).
    assert plain_seen[0] == plain_seen[-1] == torch.float32
    assert (cast_seen[0], cast_seen[-1]) == (torch.bfloat16, torch.float32)
    assert cast.dtype == torch.float32 and not torch.equal(plain, cast)
    assert torch.allclose(plain, cast, atol=0.05)
    for name, grad in cast_grads.items():
        assert grad.dtype == torch.float32, name
        scale = plain_grads[name].abs().max()
        assert (grad - plain_grads[name]).abs().max() <= 0.1 * scale + 1e-6, name
    assert Learner(model, OptimConfig(compute_dtype="bfloat16")).autocast == torch.bfloat16
    assert Learner(model, OptimConfig()).autocast is None


def test_autocast_auto_asks_whether_the_device_computes_bfloat16(tmp_path):
    from agentgym_rl.train.precision import autocast_dtype, cpu_flags

    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu, flags={"avx2", "avx512f", "avx512_bf16"}) == torch.bfloat16
    assert autocast_dtype("auto", cpu, flags={"avx2", "amx_bf16"}) == torch.bfloat16
    assert autocast_dtype("auto", cpu, flags={"avx2", "avx512f"}) is None
    assert autocast_dtype("float32", cpu, flags={"avx512_bf16"}) is None
    assert autocast_dtype("bfloat16", cpu, flags=set()) == torch.bfloat16
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse avx512_bf16 avx2\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "sse", "avx512_bf16", "avx2"}
    assert cpu_flags(tmp_path / "missing") == set()
