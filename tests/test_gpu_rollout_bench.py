"""`bench/gpu_rollout.py`'s per-turn arm (TRL's way: each turn's whole prompt into one `generate`),
on the tiny model, by hand."""

from __future__ import annotations

import torch

from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from conftest import bench_script

gpu_rollout = bench_script("gpu_rollout")


def test_a_completion_ends_with_its_first_stop_id():
    first = gpu_rollout.cut([5, 7, 2, 9, 2, 0], {2, 9})
    assert (first.ids, first.logprobs, first.finished) == ([5, 7, 2], [0.0] * 3, True)
    unfinished = gpu_rollout.cut([5, 7], {2})
    assert (unfinished.ids, unfinished.finished) == ([5, 7], False)


def test_per_turn_generate_continues_each_left_padded_prompt(tiny_tokenizer):
    torch.manual_seed(0)
    model = build_model(tiny_tokenizer, TinyModelConfig(vocab_size=400, hidden_size=16, num_layers=1, num_heads=2,
                                                        num_kv_heads=1, intermediate_size=32)).eval()
    stops = list(range(3, 200))  # half the vocabulary ends a reply: some stop early, some run to the limit
    generator = gpu_rollout.PerTurnGenerate(model, tiny_tokenizer.pad_token_id, stops, 1.0)
    prompts = [[20, 21, 22, 23, 24], [30], [40, 41]]
    replies = generator.generate(prompts, 6)
    assert len(replies) == 3
    for reply in replies:
        assert 1 <= len(reply.ids) <= 6 and len(reply.logprobs) == len(reply.ids)
        assert reply.finished == (reply.ids[-1] in stops) and not set(reply.ids[:-1]) & set(stops)
    # the short prompts are left-padded and masked: near-greedy, a prompt alone gets its reply in the batch
    nearly_greedy = gpu_rollout.PerTurnGenerate(model, tiny_tokenizer.pad_token_id, [], 1e-4)
    assert nearly_greedy.generate(prompts, 4)[1].ids == nearly_greedy.generate([[30]], 4)[0].ids
