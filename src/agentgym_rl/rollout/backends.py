"""The one place where a model becomes a rollout policy, for every command (train, eval,
bench-agent, Ray workers, the viewer's playground).

Which generator samples follows `RolloutConfig`: a model served over OpenAI's API
(`rollout.generator_url`), vLLM's offline engine (`rollout.generator: vllm`), or the Hugging
Face model in this process (`HFGenerator`, with `rollout.reuse_kv_cache` and `rollout.threads`).
A model folder is loaded in `run.dtype` on the device `run.device` names, resolved by
`agent.loading.resolve_device` as everywhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..agent.chat import ChatEncoder
from ..config import DEFAULT_DEVICE, RolloutConfig
from ..errors import UserError
from .policy import ModelPolicy


def samples_in_process(rollout: RolloutConfig) -> bool:
    """Whether `rollout` has the Hugging Face model generate in this process (not vLLM, not a
    server): only then can a loaded model be shared, or replies be restricted to listed actions."""
    return not rollout.generator_url and rollout.generator == "hf"


def model_policy(model: Any, tokenizer: Any, temperature: float, rollout: RolloutConfig | None = None,
                 listed_actions_only: bool = False, vllm_engine: Any = None) -> ModelPolicy:
    """`model` (loaded, on its device) as a rollout policy sampling at `temperature` (0: greedy)
    and stopping at its chat template's end-of-turn token.

    Args:
        rollout: the KV-cache reuse and CPU threads of the in-process generator (defaults:
            `RolloutConfig()`).
        listed_actions_only: replies restricted to the listed actions (`ModelPolicy`).
        vllm_engine: a started `VLLMEngine` over the model's weights, which samples instead.
    """
    rollout = rollout or RolloutConfig()
    encoder = ChatEncoder(tokenizer)
    if vllm_engine is not None:
        from ..agent.vllm_generator import VLLMGenerator

        generator = VLLMGenerator(vllm_engine, [encoder.end_of_turn_id], temperature)
    else:
        from ..agent.generator import HFGenerator

        generator = HFGenerator(model, tokenizer.pad_token_id, [encoder.end_of_turn_id], temperature,
                                reuse_cache=rollout.reuse_kv_cache, threads=rollout.threads)
    return ModelPolicy(generator, encoder, listed_actions_only)


def load_model(folder: str | Path, dtype: str = "float32", device: str = DEFAULT_DEVICE) -> tuple[Any, Any]:
    """(model, tokenizer) of a model folder, the model in `dtype` on `device` (`run.device`'s
    values), ready for `model_policy`."""
    from ..agent.loading import load_model_and_tokenizer, resolve_device

    model, tokenizer = load_model_and_tokenizer(folder, dtype)
    return model.to(resolve_device(device)), tokenizer


def folder_policy(folder: str | Path, temperature: float, rollout: RolloutConfig | None = None,
                  dtype: str = "float32", device: str = DEFAULT_DEVICE, seed: int = 0,
                  listed_actions_only: bool = False) -> ModelPolicy:
    """The model of a folder as a rollout policy, sampled where `rollout` says: the served
    model at `rollout.generator_url` (encoded with the folder's tokenizer), vLLM, or the folder's
    model loaded here (`load_model`)."""
    rollout = rollout or RolloutConfig()
    if listed_actions_only and not samples_in_process(rollout):
        raise UserError("--listed-actions-only needs the model generating in this process (rollout.generator: hf, "
                        "no rollout.generator_url)")
    if rollout.generator_url:
        return _served_policy(folder, rollout, temperature)
    if rollout.generator == "vllm":
        from ..agent.loading import load_tokenizer
        from ..agent.vllm_generator import VLLMEngine, require_vllm

        require_vllm()
        engine = VLLMEngine(folder, dtype, max_model_len=rollout.max_context, seed=seed)
        return model_policy(None, load_tokenizer(folder), temperature, rollout, vllm_engine=engine)
    return model_policy(*load_model(folder, dtype, device), temperature, rollout, listed_actions_only)


def _served_policy(folder: str | Path, rollout: RolloutConfig, temperature: float) -> ModelPolicy:
    """The model served at `rollout.generator_url` (OpenAI's API) as a token policy, encoded
    with the chat template of `folder`'s tokenizer (the served model's own)."""
    from ..agent.loading import load_tokenizer
    from ..agent.openai_generator import GeneratorError, OpenAIGenerator

    encoder = ChatEncoder(load_tokenizer(folder))
    base_url = rollout.generator_url
    generator = OpenAIGenerator(base_url, "", [encoder.end_of_turn_id], temperature, rollout.generator_timeout,
                                rollout.generator_retries, max_concurrency=rollout.generator_concurrency,
                                api_key=os.environ.get("OPENAI_API_KEY"))
    try:  # the served model's name, and a check before any work that the server answers
        names = generator.client.models()
    except GeneratorError as error:
        raise UserError(f"rollout.generator_url {base_url}: {error}") from None
    if not names:
        raise UserError(f"rollout.generator_url {base_url}: the server lists no model")
    generator.model = names[0]
    return ModelPolicy(generator, encoder)
