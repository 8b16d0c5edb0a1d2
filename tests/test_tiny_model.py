"""The tiny model as saved: it loads with the tokenizer it was built with."""

from __future__ import annotations

from conftest import CORPUS

from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.tiny import TinyModelConfig, build_tiny, train_tokenizer


def test_a_saved_tiny_model_loads_with_the_tokenizer_it_was_built_with(tmp_path):
    config = TinyModelConfig(vocab_size=400, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2,
                             intermediate_size=32)
    built = train_tokenizer(CORPUS, config.vocab_size)
    model, tokenizer = load_model_and_tokenizer(build_tiny(CORPUS, tmp_path / "model", config))
    # transformers' AutoTokenizer would load a Qwen2 tokenizer here: Qwen's pre-tokenizer (which
    # splits "123" into three pieces, where this one keeps it whole) and one extra token beyond
    # the embedding.
    assert len(tokenizer) == len(built) == model.config.vocab_size
    for text in [*CORPUS[:3], 'count 10 times, then 123: ["look"]']:
        assert tokenizer(text)["input_ids"] == built(text)["input_ids"]
