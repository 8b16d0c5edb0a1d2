"""Loading a local Hugging Face causal LM and its tokenizer (never from a hub): a model folder,
a named model or a `.gguf` file (prepared into a folder by `agent.models`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UserError
from .models import NAMED_MODELS, model_folder


def resolve_device(name: str) -> Any:
    """A `run.device` value as a torch device: "auto" is CUDA when torch sees a GPU, else the CPU."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("run.device is cuda but torch sees no CUDA device (set run.device=cpu or auto)")
    return torch.device(name)


def describe_device(device: Any, dtype: str) -> str:
    """One line naming where a model runs and in what dtype, e.g. "device cuda:0 (NVIDIA H200,
    140 GB), float32" or "device cpu (2 threads), float32"."""
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        properties = torch.cuda.get_device_properties(index)
        where = f"cuda:{index} ({properties.name}, {properties.total_memory / 1e9:.0f} GB)"
    else:
        where = f"{device.type} ({torch.get_num_threads()} threads)"
    return f"device {where}, {dtype}"


def load_model_and_tokenizer(path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    """Load `AutoModelForCausalLM` and `AutoTokenizer` from a local folder (or a named model or
    `.gguf` file: `agent.models.model_folder`).

    Raises:
        UserError: the folder does not exist, is not a model folder, is damaged
            (`model_damage`), or the tokenizer has no chat template.
    """
    import torch
    from transformers import AutoModelForCausalLM

    folder = model_folder(path)
    damage = model_damage(folder) if (folder / "config.json").is_file() else None  # else load_tokenizer says why
    if damage is not None:
        raise UserError(f"model path {str(path)!r} does not load: {damage}")
    tokenizer = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype))
    return model, tokenizer


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a local model folder (with a pad token; see `load_model_and_tokenizer`)."""
    folder = model_folder(path)
    if not folder.is_dir():
        raise UserError(f"model path {str(path)!r} is not a directory (a named model is one of: "
                        f"{', '.join(sorted(NAMED_MODELS))}; `agentgym-rl models list`)")
    if not (folder / "config.json").is_file():
        raise UserError(f"model path {str(path)!r} has no config.json (not a Hugging Face model folder)")
    tokenizer = _tokenizer_class(folder).from_pretrained(folder, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer in {str(path)!r} has no chat_template")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_damage(folder: Path) -> str | None:
    """Why the model folder cannot load, from what is cheap to check (its `config.json` parses,
    each safetensors file holds all its header promises), or None when it looks whole."""
    from safetensors import SafetensorError, safe_open

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        return f"config.json: {getattr(error, 'strerror', None) or error}"
    if not isinstance(config, dict):
        return "config.json is not a JSON object"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(folder.glob("*.bin")):
        return "no weights file"
    for path in weights:
        try:
            with safe_open(str(path), "pt"):
                pass
        except (OSError, SafetensorError) as error:
            return f"{path.name}: {error}"
    return None


# Tokenizer classes that take `tokenizer.json` as it is written.
_GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _tokenizer_class(folder: Path) -> Any:
    """The class to load `folder`'s tokenizer with.

    `AutoTokenizer` picks the class registered for the model type when `tokenizer_config.json`
    names a generic one, and for Qwen2 that class rebuilds the pre-tokenizer with Qwen's regex
    and adds an `<|endoftext|>` token: the tiny model's tokenizer would then split text other
    than as it was trained to, and could emit an id beyond the embedding. A folder whose
    tokenizer config names a generic class is loaded with that class instead.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = folder / "tokenizer_config.json"
    if (folder / "tokenizer.json").is_file() and config.is_file():
        try:
            named = json.loads(config.read_text()).get("tokenizer_class")
        except (ValueError, AttributeError):
            return AutoTokenizer  # which reports the broken file its own way
        if named in _GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast
    return AutoTokenizer
