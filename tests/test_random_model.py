"""The model shapes the project ships for sizing its one-GPU recipes (`configs/gpu/models/`), and
`bench/random_model.py`'s folders of random weights, by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import bench_script

random_model = bench_script("random_model")
MODELS = Path(__file__).resolve().parent.parent / "configs" / "gpu" / "models"


@pytest.mark.parametrize("name, parameters", [
    # 0.5B: embedding 151,936 x 896 = 136,134,656; a layer: q 896x896+896, k and v 896x128+128 each,
    # o 896x896, MLP 3 x 896x4,864, two norms 2x896 = 14,912,384, x 24 = 357,897,216; final norm 896.
    ("qwen2.5-0.5b-instruct", 136_134_656 + 357_897_216 + 896),
    # 1.5B: embedding 151,936 x 1,536 = 233,373,696; a layer 5,507,072 + 41,287,680 + 3,072, x 28; final norm.
    ("qwen2.5-1.5b-instruct", 233_373_696 + 28 * 46_797_824 + 1_536),
])
def test_a_shipped_config_has_its_models_parameter_count(name, parameters):
    assert random_model.parameter_count(MODELS / f"{name}.json") == parameters


def test_a_random_model_folder_loads_as_a_model_folder(tmp_path, tiny_tokenizer, monkeypatch):
    import json
    import sys

    from agentgym_rl.agent.loading import load_model_and_tokenizer
    from agentgym_rl.agent.tiny import TinyModelConfig, build_model

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 16, "intermediate_size": 32,
                                  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                  "vocab_size": 512, "tie_word_embeddings": True}))
    tiny = TinyModelConfig(vocab_size=400, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=32)
    build_model(tiny_tokenizer, tiny).save_pretrained(tmp_path / "tok")
    tiny_tokenizer.save_pretrained(tmp_path / "tok")  # a model folder: its tokenizer is what is copied
    monkeypatch.setattr(sys, "argv", ["random_model.py", str(config), "--tokenizer", str(tmp_path / "tok"),
                                      "--out", str(tmp_path / "out"), "--dtype", "float32"])
    random_model.main()
    model, tokenizer = load_model_and_tokenizer(tmp_path / "out")
    # embedding 512x16; q 16x16+16, k and v 16x8+8 each, o 16x16, MLP 3x16x32, norms 32; final norm 16
    assert sum(p.numel() for p in model.parameters()) == 8192 + 272 + 136 + 136 + 256 + 1536 + 32 + 16
    assert len(tokenizer) == len(tiny_tokenizer)
