"""Shared prompts run once in the update: families, tree rows, and scores equal to the padded batch's."""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym_rl.agent.attention import NAME, use_grouped_attention
from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from agentgym_rl.rollout.trajectory import Trajectory
from agentgym_rl.train.batch import collate
from agentgym_rl.train.finetune import nll_loss
from agentgym_rl.train.learner import Learner, OptimConfig, token_outputs
from agentgym_rl.train.prefix_sharing import TreeRow, families, tree_inputs, tree_micro_batches, tree_rows

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                        max_positions=128)


def test_families_share_what_saves_most_and_never_a_trained_token():
    p = list(range(10, 20))
    tokens = [p + [1, 2], p + [3], [7, 7, 7, 7], p[:4] + [9, 9], p + [5, 5, 5]]
    # Row 0 trains from position 10, row 1 from 9 (so at most 9 tokens are shared with it).
    firsts = [10, 9, 4, 6, 10]
    out = families(tokens, firsts, min_shared=3)
    # Rows 0, 1 and 4 share 9 tokens (saving 2 x 9); adding row 3 would share 4 (3 x 4 < 18).
    assert sorted(out) == [([0, 1, 4], 9), ([2], 0), ([3], 0)]
    # Below min_shared a family is single rows (rows 0 and 4 share 10 tokens).
    assert sorted(families(tokens, firsts, min_shared=11)) == [([0], 0), ([1], 0), ([2], 0), ([3], 0), ([4], 0)]
    # A cap on the tree row's width (9 + 3 + 2 + 4 = 18 > 15 for rows 0, 1, 4) or on the
    # members: the best pair is rows 0 and 4 (10 shared), not 0 and 1 (9), and then rows 1 and
    # 3 share 4.
    for cap in ({"max_tokens": 15}, {"max_rows": 2}):
        assert sorted(families(tokens, firsts, min_shared=3, **cap)) == [([0, 4], 10), ([1, 3], 4), ([2], 0)]


def test_tree_inputs_lay_each_prefix_once_and_gather_every_token_back():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 6, 0], [8, 9, 0, 0, 0]])
    lengths = [5, 4, 2]
    trees = tree_rows(lengths, [([0, 1], 3), ([2], 0)])
    assert trees == [TreeRow((0, 1), 3, ((3, 5), (5, 6))), TreeRow((2,), 0, ((0, 2),))]
    tree_ids, positions, gather = tree_inputs(ids, lengths, trees, pad_id=0)
    assert tree_ids.tolist() == [[1, 2, 3, 4, 5, 6], [8, 9, 0, 0, 0, 0]]
    assert positions.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 0, 0, 0, 0]]
    flat = tree_ids.flatten()
    for row, n in enumerate(lengths):
        assert flat[gather[row, :n]].tolist() == ids[row, :n].tolist()


def _episodes(tokenizer):
    """Two groups of three samples sharing a 40-token prompt, and one episode alone; replies of
    different lengths, the first token of each reply trained."""
    prompt_a = tokenizer.encode("Your goal: go to the red ball. You see a wall 2 steps ahead. " * 3)[:40]
    prompt_b = tokenizer.encode("Your goal: open the door. You carry nothing and see a key. " * 3)[:40]
    assert len(prompt_a) == len(prompt_b) == 40 and prompt_a != prompt_b
    replies = [[30, 31, 32], [33, 34, 35, 36, 37], [38], [39, 40], [41, 42, 43, 44], [45, 46, 47]]
    rows = []
    for i, reply in enumerate(replies):
        prompt = prompt_a if i < 3 else prompt_b
        observation = [50 + i] * (i + 1)  # a second turn: an observation (context), then a reply
        ids = prompt + reply + observation + reply[:2]
        mask = [0] * len(prompt) + [1] * len(reply) + [0] * len(observation) + [1] * len(reply[:2])
        rows.append(Trajectory("e", f"e_{i}", "c", group=i // 3, input_ids=ids, loss_mask=mask))
    rows.append(Trajectory("e", "e_6", "c", group=2, input_ids=prompt_a[:20] + [60, 61], loss_mask=[0] * 20 + [1, 1]))
    return rows


def _model(tokenizer):
    model = build_model(tokenizer, SMALL, seed=0)
    with torch.no_grad():  # sharper than the initialisation, so that attention weights matter
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    use_grouped_attention(model)
    assert model.config._attn_implementation == NAME
    return model


def test_tree_rows_score_and_train_as_the_padded_batch(tiny_tokenizer):
    """Logprobs, entropies, values and every gradient through tree rows equal those of the
    right-padded batch, where each row runs alone (within float tolerance)."""
    batch = collate(_episodes(tiny_tokenizer), tiny_tokenizer.pad_token_id)
    [(rows, micro, trees)] = tree_micro_batches(batch, size=64)
    assert sorted(len(tree.rows) for tree in trees) == [1, 3, 3] and {tree.prefix for tree in trees} == {0, 40}
    model = _model(tiny_tokenizer)
    head = torch.nn.Linear(SMALL.hidden_size, 1)
    results = []
    for layout in (None, trees):
        model.zero_grad()
        head.zero_grad()
        out = token_outputs(model, micro, head, entropy=True, temperature=0.8, trees=layout)
        mask = micro.loss_mask
        loss = ((out.logprobs + out.entropy) * mask).sum() + (out.values * micro.attention_mask).sum()
        loss.backward()
        results.append(({k: v.detach() for k, v in vars(out).items() if v is not None},
                        [p.grad.clone() for p in [*model.parameters(), *head.parameters()]]))
    (padded, padded_grads), (tree, tree_grads) = results
    real = micro.attention_mask.bool()
    for key in ("logprobs", "entropy", "values"):
        assert torch.allclose(padded[key][real], tree[key][real], atol=1e-5), key
    flat_padded, flat_tree = torch.cat([g.flatten() for g in padded_grads]), torch.cat([g.flatten() for g in tree_grads])
    # Relative to the whole gradient: float rounding differs with the thread count and layout.
    assert (flat_padded - flat_tree).norm() / flat_padded.norm() < 1e-5


def test_the_learner_shares_prefixes_in_its_update_and_steps_as_without(tiny_tokenizer):
    """One optimizer step with `optim.share_prefixes` (the default) moves the weights as the
    same step over padded rows does, in micro-batches of a token budget."""
    batch = collate(_episodes(tiny_tokenizer), tiny_tokenizer.pad_token_id)
    model = _model(tiny_tokenizer)
    twin = copy.deepcopy(model)
    shared = Learner(model, OptimConfig(lr=0.01, micro_batch_tokens=160, grad_clip=0))
    padded = Learner(twin, OptimConfig(lr=0.01, micro_batch_tokens=160, grad_clip=0, share_prefixes=False))
    # Tree rows 22 (the lone row), 60 and 70 wide: at most 160 cells, the widest goes alone.
    assert [[tree.width for tree in trees] for _, _, trees in shared._micro_batches(batch)] == [[22, 60], [70]]
    calls = []
    original = shared.model.forward
    shared.model.forward = lambda *a, **k: calls.append("prefix_tree" in k) or original(*a, **k)
    shared.update(batch, nll_loss)
    padded.update(batch, nll_loss)
    assert calls and all(calls)
    flat = [torch.cat([p.grad.flatten() for p in m.parameters()]) for m in (model, twin)]
    assert (flat[0] - flat[1]).norm() / flat[1].norm() < 1e-5
    with torch.no_grad():
        assert torch.allclose(shared.logprobs(batch), padded.logprobs(batch), atol=1e-5)
