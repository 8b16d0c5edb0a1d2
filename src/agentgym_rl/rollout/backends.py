"""The one place where a model becomes a rollout policy, for every command (train, eval,
bench-agent, Ray workers, the viewer's playground).

Which generator samples follows `RolloutConfig` (`backend_of`): a model served over OpenAI's
API (`rollout.generator_url`), vLLM's offline engine (`rollout.generator: vllm`), or the Hugging
Face model in this process (`HFGenerator`, with `rollout.reuse_kv_cache` and `rollout.threads`).
What each supports is one row of `BACKENDS`, which the trainers, evaluation and the config's
checks read. A model folder is loaded in `run.dtype` on the device `run.device` names, resolved
by `agent.loading.resolve_device` as everywhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..agent.chat import ChatEncoder
from ..config import DEFAULT_DEVICE, RolloutConfig
from ..errors import UserError
from .policy import ModelPolicy


def _require_vllm() -> None:
    from ..agent.vllm_generator import require_vllm

    require_vllm()


@dataclass(frozen=True)
class GeneratorBackend:
    """One way a model policy's replies are sampled, and what it supports.

    Attributes:
        name: `rollout.generator`'s value ("served": `rollout.generator_url` is set).
        about: what samples, in a few words (said when a setting clashes with it).
        in_process: the model generates in this process from weights loaded here: only then
            can a loaded model be shared between policies, or replies be restricted to the
            listed actions (`--listed-actions-only`).
        trains: it follows the learner's weights, synced after every update (training may use it).
        lora: it samples from a model wrapped in a LoRA adapter.
        asynchronous: it plays beside the update (`train.asynchronous`).
        ray_workers: Ray rollout workers (`rollout.workers`) run it, one copy each.
        devices: the `run.device` values it samples on.
        requires: raises a `UserError` naming what to install when that is missing; None: nothing.
    """

    name: str
    about: str
    in_process: bool
    trains: bool
    lora: bool
    asynchronous: bool
    ray_workers: bool
    devices: tuple[str, ...] = ("cpu", "cuda")
    requires: Callable[[], None] | None = None


BACKENDS = {backend.name: backend for backend in (
    GeneratorBackend("hf", "transformers in this process", in_process=True, trains=True, lora=True,
                     asynchronous=True, ray_workers=True),
    GeneratorBackend("vllm", "vLLM's offline engine", in_process=False, trains=True, lora=False, asynchronous=False,
                     ray_workers=False, requires=_require_vllm),
    GeneratorBackend("slots", "the slot-cache generator", in_process=True, trains=True, lora=False,
                     asynchronous=True, ray_workers=False),
    GeneratorBackend("served", "a model served over OpenAI's API (rollout.generator_url)", in_process=False,
                     trains=False, lora=False, asynchronous=False, ray_workers=False),
)}
"""Every generator backend by name; `rollout.generator` names one of them but "served"."""


def backend_of(rollout: RolloutConfig) -> GeneratorBackend:
    """The backend `rollout` samples with: "served" when it names a `generator_url`, else its
    `generator`."""
    return BACKENDS["served" if rollout.generator_url else rollout.generator]


def samples_in_process(rollout: RolloutConfig) -> bool:
    """Whether `rollout`'s backend generates in this process (`GeneratorBackend.in_process`)."""
    return backend_of(rollout).in_process


def model_policy(model: Any, tokenizer: Any, temperature: float, rollout: RolloutConfig | None = None,
                 listed_actions_only: bool = False, vllm_engine: Any = None) -> ModelPolicy:
    """`model` (loaded, on its device) as a rollout policy sampling at `temperature` (0: greedy)
    and stopping at its chat template's end-of-turn token (and `rollout.stop_strings`).

    Args:
        rollout: the KV-cache reuse and CPU threads of the in-process generator (defaults:
            `RolloutConfig()`).
        listed_actions_only: replies restricted to the listed actions (`ModelPolicy`).
        vllm_engine: a started `VLLMEngine` over the model's weights, which samples instead.
    """
    rollout = rollout or RolloutConfig()
    encoder = ChatEncoder(tokenizer)
    if listed_actions_only and rollout.stop_strings:
        raise UserError("rollout.stop_strings and listed_actions_only both end the replies; use one of them")
    stops = reply_stop_ids(encoder, rollout.stop_strings)
    if vllm_engine is not None:
        from ..agent.vllm_generator import VLLMGenerator

        generator = VLLMGenerator(vllm_engine, stops, temperature)
    elif rollout.generator == "slots":
        from ..agent.slot_generator import SlotGenerator

        generator = SlotGenerator(model, tokenizer.pad_token_id, stops, temperature,
                                  slots=slot_count(model, rollout), max_len=rollout.max_context)
    else:
        from ..agent.generator import HFGenerator

        generator = HFGenerator(model, tokenizer.pad_token_id, stops, temperature,
                                reuse_cache=rollout.reuse_kv_cache, threads=rollout.threads)
    return ModelPolicy(generator, encoder, listed_actions_only)


def reply_stop_ids(encoder: ChatEncoder, stop_strings: list[str]) -> list[int]:
    """The token ids that end a reply: the end-of-turn token first, then every other token of
    the vocabulary whose text holds one of `stop_strings` (special tokens aside).

    Raises:
        UserError: a stop string no token holds (it could never end a reply).
    """
    if not stop_strings:
        return [encoder.end_of_turn_id]
    tokenizer = encoder.tokenizer
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    texts = tokenizer.batch_decode([[i] for i in ids])
    stops = dict.fromkeys([encoder.end_of_turn_id])
    for stop in stop_strings:
        holding = [i for i, text in zip(ids, texts) if stop in text]
        if not holding:
            raise UserError(f"rollout.stop_strings: no token of the tokenizer holds {stop!r}")
        stops.update(dict.fromkeys(holding))
    return list(stops)


MOST_SLOTS = 128
"""The slot generator's slots when `rollout.max_envs` is 0 and `kv_cache_mb` would hold more."""


def slot_count(model: Any, rollout: RolloutConfig) -> int:
    """The slot generator's slots, each of `max_context` tokens and allocated whole: `max_envs`,
    or with 0 as many as `kv_cache_mb` holds (at least 1, at most `MOST_SLOTS`): SmolLM2-135M in
    float32 at 8,192 tokens takes 360 MB a slot, so 32,768 MB give 91."""
    if rollout.max_envs:
        return rollout.max_envs
    from ..agent.kv_cache import bytes_per_token

    return min(rollout.episodes_in_cache(bytes_per_token(model)), MOST_SLOTS)


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
    backend = backend_of(rollout)
    if listed_actions_only and not backend.in_process:
        raise UserError(f"--listed-actions-only needs the model generating in this process (rollout.generator: hf), "
                        f"not {backend.about}")
    if backend.requires is not None:
        backend.requires()
    if backend.name == "served":
        return _served_policy(folder, rollout, temperature)
    if backend.name == "vllm":
        from ..agent.loading import load_tokenizer
        from ..agent.vllm_generator import VLLMEngine

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
    stops = reply_stop_ids(encoder, rollout.stop_strings)
    generator = OpenAIGenerator(base_url, "", stops, temperature, rollout.generator_timeout, rollout.generator_retries,
                                max_concurrency=rollout.generator_concurrency, api_key=os.environ.get("OPENAI_API_KEY"))
    try:  # the served model's name, and a check before any work that the server answers
        names = generator.client.models()
    except GeneratorError as error:
        raise UserError(f"rollout.generator_url {base_url}: {error}") from None
    if not names:
        raise UserError(f"rollout.generator_url {base_url}: the server lists no model")
    generator.model = names[0]
    return ModelPolicy(generator, encoder)
