"""The tiny offline default model: a tokenizer trained on environment text and a small
Qwen2-architecture causal LM, saved as an ordinary Hugging Face folder.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here with `tokenizers`
(byte-level so that every string round-trips exactly), the model is randomly initialised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from ..config import TinyModelConfig

SPECIAL_TOKENS = ["<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# Jinja chat template of the tiny model: role marker, content, end-of-turn, newline.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Train a byte-level BPE tokenizer with the tiny chat template.

    Returns:
        a `transformers.PreTrainedTokenizerFast` with pad/eos set and `chat_template`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|pad|>",
        eos_token="<|end|>",
        additional_special_tokens=SPECIAL_TOKENS[1:4],
    )
    wrapped.chat_template = TINY_CHAT_TEMPLATE
    return wrapped


def build_model(tokenizer, config: TinyModelConfig, seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM sized by `config` for `tokenizer`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_positions,
        use_sliding_window=config.sliding_window is not None,
        sliding_window=config.sliding_window,
        max_window_layers=0,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(model_config)


def build_tiny(corpus: Iterable[str], out_dir: str | Path, config: TinyModelConfig | None = None,
               seed: int = 0) -> Path:
    """Train the tokenizer, build the model, save both to `out_dir`; returns the path."""
    config = config or TinyModelConfig()
    tokenizer = train_tokenizer(corpus, config.vocab_size)
    model = build_model(tokenizer, config, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
