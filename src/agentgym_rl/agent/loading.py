"""Loading a local Hugging Face causal LM and its tokenizer (never from a hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UserError


def load_model_and_tokenizer(path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    """Load `AutoModelForCausalLM` and `AutoTokenizer` from a local folder.

    Raises:
        UserError: the folder does not exist, is not a model folder, or the tokenizer has
            no chat template.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"model path {str(path)!r} is not a directory")
    if not (folder / "config.json").is_file():
        raise UserError(f"model path {str(path)!r} has no config.json (not a Hugging Face model folder)")
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer in {str(path)!r} has no chat_template")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=getattr(torch, dtype)
    )
    return model, tokenizer
