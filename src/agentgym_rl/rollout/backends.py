"""The one place where a model becomes a rollout policy, for every command (train, eval,
bench-agent, Ray workers, the viewer's playground).

Which generator samples follows `RolloutConfig` (`backend_of`): a model served over OpenAI's
API (`rollout.generator_url`), vLLM's offline engine (`rollout.generator: vllm`), the slot-cache
generator (`slots`), or the Hugging Face model in this process (`HFGenerator`, with
`rollout.reuse_kv_cache` and `rollout.threads`). How each is built and what it supports is one row
of `BACKENDS`, which the trainers, evaluation and the config's checks read: adding a backend is a
row (and its name in `RolloutConfig.generator`). A model folder is loaded in `run.dtype` on the
device `run.device` names, resolved by `agent.loading.resolve_device` as everywhere else.
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
class GeneratorParts:
    """What a backend's generator is built from (`GeneratorBackend.build`).

    Attributes:
        model: the loaded model (None where the backend samples outside this process).
        pad_id: the tokenizer's padding id.
        stops: the token ids that end a reply (`reply_stop_ids`).
        temperature: the sampling temperature (0: greedy).
        rollout: the generator settings.
        engine: the backend's started engine (`GeneratorBackend.engine`), else None.
    """

    model: Any
    pad_id: int | None
    stops: list[int]
    temperature: float
    rollout: RolloutConfig
    engine: Any = None


def _hf_generator(parts: GeneratorParts) -> Any:
    from ..agent.generator import HFGenerator

    return HFGenerator(parts.model, parts.pad_id, parts.stops, parts.temperature,
                       reuse_cache=parts.rollout.reuse_kv_cache, threads=parts.rollout.threads)


def _slot_generator(parts: GeneratorParts) -> Any:
    from ..agent.slot_generator import SlotGenerator

    return SlotGenerator(parts.model, parts.pad_id, parts.stops, parts.temperature,
                         slots=slot_count(parts.model, parts.rollout), max_len=parts.rollout.max_context)


def _vllm_generator(parts: GeneratorParts) -> Any:
    from ..agent.vllm_generator import VLLMGenerator

    return VLLMGenerator(parts.engine, parts.stops, parts.temperature)


def _vllm_engine(folder: str | Path, dtype: str, rollout: RolloutConfig, seed: int) -> Any:
    from ..agent.vllm_generator import VLLMEngine

    return VLLMEngine(folder, dtype, max_model_len=rollout.max_context, seed=seed)


def _served_generator(parts: GeneratorParts) -> Any:
    """A client of the model served at `rollout.generator_url` (OpenAI's API), asking it for
    its model's name first: a server that does not answer is a one-line error before any work."""
    from ..agent.openai_generator import GeneratorError, OpenAIGenerator

    rollout = parts.rollout
    base_url = rollout.generator_url
    generator = OpenAIGenerator(base_url, "", parts.stops, parts.temperature, rollout.generator_timeout,
                                rollout.generator_retries, max_concurrency=rollout.generator_concurrency,
                                api_key=os.environ.get("OPENAI_API_KEY"))
    try:
        names = generator.client.models()
    except GeneratorError as error:
        raise UserError(f"rollout.generator_url {base_url}: {error}") from None
    if not names:
        raise UserError(f"rollout.generator_url {base_url}: the server lists no model")
    generator.model = names[0]
    return generator


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
        build: makes the generator from `GeneratorParts`.
        engine: starts the engine the generator samples through, from a model folder, dtype,
            rollout settings and seed (vLLM's): once a training run, once a `folder_policy`
            call; None: it needs none.
        devices: the torch device types (`run.device`, resolved) an in-process backend samples on;
            the others sample where their engine or server runs.
        requires: raises a `UserError` naming what to install when that is missing; None: nothing.
    """

    name: str
    about: str
    in_process: bool
    trains: bool
    lora: bool
    asynchronous: bool
    ray_workers: bool
    build: Callable[[GeneratorParts], Any]
    engine: Callable[[str | Path, str, RolloutConfig, int], Any] | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    requires: Callable[[], None] | None = None


BACKENDS = {backend.name: backend for backend in (
    GeneratorBackend("hf", "transformers in this process", in_process=True, trains=True, lora=True,
                     asynchronous=True, ray_workers=True, build=_hf_generator),
    GeneratorBackend("vllm", "vLLM's offline engine", in_process=False, trains=True, lora=False, asynchronous=False,
                     ray_workers=False, build=_vllm_generator, engine=_vllm_engine, requires=_require_vllm),
    GeneratorBackend("slots", "the slot-cache generator", in_process=True, trains=True, lora=False,
                     asynchronous=True, ray_workers=False, build=_slot_generator),
    GeneratorBackend("served", "a model served over OpenAI's API (rollout.generator_url)", in_process=False,
                     trains=False, lora=False, asynchronous=False, ray_workers=False, build=_served_generator),
)}
"""Every generator backend by name; `rollout.generator` names one of them but "served"."""


def backend_of(rollout: RolloutConfig) -> GeneratorBackend:
    """The backend `rollout` samples with: "served" when it names a `generator_url`, else its
    `generator`."""
    return BACKENDS["served" if rollout.generator_url else rollout.generator]


def check_backend(rollout: RolloutConfig, device: str) -> GeneratorBackend:
    """`rollout`'s backend, once it is known to run here: its packages installed
    (`GeneratorBackend.requires`) and, for one in this process, `device` (`run.device`'s
    values) among its `devices`.

    Raises:
        UserError: what is missing, or the device it does not sample on.
    """
    backend = backend_of(rollout)
    if backend.requires is not None:
        backend.requires()
    if backend.in_process:
        from ..agent.loading import resolve_device

        where = resolve_device(device).type
        if where not in backend.devices:
            raise UserError(f"{backend.about} does not sample on {where} (it does on {', '.join(backend.devices)}): "
                            f"set run.device or rollout.generator")
    return backend


def samples_in_process(rollout: RolloutConfig) -> bool:
    """Whether `rollout`'s backend generates in this process (`GeneratorBackend.in_process`)."""
    return backend_of(rollout).in_process


def model_policy(model: Any, tokenizer: Any, temperature: float, rollout: RolloutConfig | None = None,
                 listed_actions_only: bool = False, engine: Any = None) -> ModelPolicy:
    """`model` (loaded, on its device) as a rollout policy sampling at `temperature` (0: greedy)
    and stopping at its chat template's end-of-turn token (and `rollout.stop_strings`), through
    the backend `rollout` names (`backend_of`).

    Args:
        model: the loaded model; None for a backend that samples outside this process.
        rollout: the generator settings (defaults: `RolloutConfig()`).
        listed_actions_only: replies restricted to the listed actions (`ModelPolicy`).
        engine: the backend's started engine over the model's weights (`GeneratorBackend.engine`:
            vLLM's), which it needs and samples through.
    """
    rollout = rollout or RolloutConfig()
    backend = backend_of(rollout)
    if (backend.engine is None) != (engine is None):
        raise ValueError(f"{backend.about} {'needs' if engine is None else 'takes no'} engine")
    encoder = ChatEncoder(tokenizer)
    if listed_actions_only and rollout.stop_strings:
        raise UserError("rollout.stop_strings and listed_actions_only both end the replies; use one of them")
    stops = reply_stop_ids(encoder, rollout.stop_strings)
    parts = GeneratorParts(model, tokenizer.pad_token_id, stops, temperature, rollout, engine)
    return ModelPolicy(backend.build(parts), encoder, listed_actions_only)


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
    """The model of a folder as a rollout policy, sampled where `rollout` says: the folder's
    model loaded here (`load_model`), or, by a backend that samples elsewhere (a served model, vLLM),
    with the folder's tokenizer encoding."""
    from ..agent.loading import load_tokenizer

    rollout = rollout or RolloutConfig()
    backend = backend_of(rollout)
    if listed_actions_only and not backend.in_process:
        raise UserError(f"--listed-actions-only needs the model generating in this process (rollout.generator: hf), "
                        f"not {backend.about}")
    check_backend(rollout, device)
    model, tokenizer = load_model(folder, dtype, device) if backend.in_process else (None, load_tokenizer(folder))
    engine = backend.engine(folder, dtype, rollout, seed) if backend.engine is not None else None
    return model_policy(model, tokenizer, temperature, rollout, listed_actions_only, engine=engine)
