"""The in-place appending KV cache: hand-checked buffer arithmetic, and generation equal to
transformers' own DynamicCache."""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.cache_utils import DynamicCache

from agentgym_rl.agent.kv_cache import SPARE_COLUMNS, AppendLayer, _append, appending_cache
from agentgym_rl.agent.tiny import TinyModelConfig, build_model


def _columns(batch: int, start: int, count: int) -> torch.Tensor:
    """(batch, 1, count, 2) whose column j holds the value start + j."""
    values = torch.arange(start, start + count, dtype=torch.float)
    return values.view(1, 1, count, 1).expand(batch, 1, count, 2).clone()


def test_append_writes_into_the_spare_columns_and_reallocates_when_full():
    buffer, view = _append(None, torch.tensor([]), _columns(2, 0, 3))
    assert buffer.shape[2] == 3 + SPARE_COLUMNS and view.shape[2] == 3
    first = buffer
    buffer, view = _append(buffer, view, _columns(2, 3, 1))
    assert buffer is first  # in place
    assert view[0, 0, :, 0].tolist() == [0, 1, 2, 3]
    buffer, view = _append(buffer, view, _columns(2, 4, SPARE_COLUMNS))  # one column too many
    assert buffer is not first and view.shape[2] == 4 + SPARE_COLUMNS
    assert view[1, 0, :, 1].tolist() == list(range(4 + SPARE_COLUMNS))


def test_a_layer_whose_rows_were_selected_appends_to_the_selected_rows():
    layer = AppendLayer()
    keys = torch.cat([_columns(1, 0, 2), _columns(1, 10, 2)])  # row 0: 0 1, row 1: 10 11
    layer.update(keys, keys.clone())
    layer.batch_select_indices(torch.tensor([1]))
    keys, values = layer.update(_columns(1, 12, 1), _columns(1, 12, 1))
    assert keys[0, 0, :, 0].tolist() == [10, 11, 12] and torch.equal(keys, values)
    assert layer.get_seq_length() == 3


def test_generation_with_the_appending_cache_equals_transformers_dynamic_cache(tiny_tokenizer):
    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                                        intermediate_size=64, max_positions=256)).eval()
    prompt = torch.tensor([tiny_tokenizer.encode("Your goal: go to the red ball. You can see a wall")])
    config = GenerationConfig(max_new_tokens=SPARE_COLUMNS + 8, do_sample=False, eos_token_id=[],
                              pad_token_id=tiny_tokenizer.pad_token_id, output_scores=True,
                              return_dict_in_generate=True)
    with torch.no_grad():
        plain = model.generate(prompt, generation_config=config, past_key_values=DynamicCache())
        appended = model.generate(prompt, generation_config=config, past_key_values=appending_cache(model.config))
    assert all(isinstance(layer, AppendLayer) for layer in appended.past_key_values.layers)
    assert torch.equal(plain.sequences, appended.sequences)
    assert torch.allclose(torch.stack(plain.scores), torch.stack(appended.scores), atol=1e-5)


def test_a_raised_next_spare_makes_room_for_the_columns_that_follow_once():
    """A prefill split in two passes reserves room for its second pass: no second allocation."""
    layer = AppendLayer()
    layer.next_spare = SPARE_COLUMNS + 100
    layer.update(_columns(1, 0, 2), _columns(1, 0, 2))
    buffer = layer._key_buffer
    assert buffer.shape[2] == 2 + SPARE_COLUMNS + 100 and layer.next_spare == SPARE_COLUMNS
    keys, _ = layer.update(_columns(1, 2, SPARE_COLUMNS + 100), _columns(1, 2, SPARE_COLUMNS + 100))
    assert layer._key_buffer is buffer  # written in place
    assert keys[0, 0, :, 0].tolist() == list(range(2 + SPARE_COLUMNS + 100))
