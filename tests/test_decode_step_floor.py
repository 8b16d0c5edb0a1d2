"""`bench/decode_step.py`'s bandwidth floor of a decoding step, by hand."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import bench_script

decode_step = bench_script("decode_step")


def test_a_tied_model_counts_its_embedding_once():
    # hidden 8, 2 query heads over 1 key/value head of 4, MLP 16, 1 layer, vocabulary 10:
    # embedding 80; q 64, k 32, v 32, o 64, gate 128, up 128, down 128, two norms 16; final norm 8.
    # The tied output head is the embedding: 680 parameters of 4 bytes (an untied one adds 80).
    model = LlamaForCausalLM(LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=10,
                                         tie_word_embeddings=True))
    assert decode_step.weight_bytes(model) == 680 * 4
    assert decode_step.weight_bytes(model.to(torch.bfloat16)) == 680 * 2


def test_the_floor_reads_the_weights_and_every_rows_cache_once():
    # SmolLM2-135M in bfloat16 at 128 rows of 1,024 cached tokens, 4.24 TB/s: 269 MB of weights,
    # 128 x 1,024 x 23,040 bytes = 3,019,898,880 bytes of keys and values: 0.7758 ms.
    weights = 134_515_008 * 2
    assert decode_step.floor_ms(weights, 23_040, 128, 1024, 4.24e12) == pytest.approx(0.7757, abs=1e-4)
    assert decode_step.floor_ms(1000, 10, 0, 1024, 1e6) == pytest.approx(1.0)  # no rows: the weights alone


def test_the_measured_bandwidth_counts_the_read_and_the_write(monkeypatch):
    times = iter([0.7, 0.5, 0.6])  # the best of three copies of 8 MiB: 0.5 s
    monkeypatch.setattr(decode_step, "timed", lambda function, device: (function(), next(times))[1])
    assert decode_step.bandwidth(torch.device("cpu"), megabytes=8, reps=3) == 2 * 8 * 2**20 / 0.5
