"""Generators: turn batches of prompt token ids into sampled continuations.

The rollout engine only knows the `Generator` protocol, so a vLLM or HTTP backend can
replace the Hugging Face one without touching it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Generation:
    """One sampled continuation.

    Attributes:
        ids: generated token ids, ending with the stop token when `finished`.
        logprobs: log-probability of each id under the sampling distribution, len == len(ids).
        finished: True when a stop token ended it, False when it hit the token limit.
    """

    ids: list[int]
    logprobs: list[float]
    finished: bool


class Generator(Protocol):
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        """Sample one continuation per prompt."""
        ...


class HFGenerator:
    """Batched sampling with a Hugging Face causal LM (left-padded, KV-cached).

    Sampling is plain temperature sampling over the whole vocabulary (no top-k/top-p), so
    the returned logprobs are exactly those of the distribution the ids were drawn from.

    Args:
        model: a `transformers` causal LM (shared with the learner: weights are in sync).
        pad_id: padding token id.
        stop_ids: token ids that end a turn.
        temperature: 0 means greedy decoding.
        batch_size: the most prompts per forward pass.
    """

    def __init__(self, model: Any, pad_id: int, stop_ids: list[int], temperature: float = 1.0,
                 batch_size: int = 64):
        self.model = model
        self.pad_id = pad_id
        self.stop_ids = list(stop_ids)
        self.temperature = temperature
        self.batch_size = batch_size

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        results: list[Generation] = []
        # Similar lengths together waste less padding.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        by_index: dict[int, Generation] = {}
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            for i, gen in zip(chunk, self._generate_batch([prompts[i] for i in chunk], max_new_tokens)):
                by_index[i] = gen
        results = [by_index[i] for i in range(len(prompts))]
        return results

    def _generate_batch(self, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        import torch
        from transformers import GenerationConfig

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt):] = 1
        greedy = self.temperature <= 0
        # top_k=0 because None would mean transformers' default top-k of 50.
        sampling = {} if greedy else {"temperature": self.temperature, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            **sampling,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
        self.model.train(was_training)
        new_ids = out.sequences[:, width:]
        # scores: one (B, V) tensor per generated position, already divided by temperature.
        logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1)
        token_logprobs = logprobs.gather(-1, new_ids.unsqueeze(-1)).squeeze(-1)
        stop = set(self.stop_ids)
        generations = []
        for row in range(len(prompts)):
            ids = new_ids[row].tolist()
            end = next((k + 1 for k, t in enumerate(ids) if t in stop), None)
            finished = end is not None
            end = end if finished else len(ids)
            generations.append(Generation(ids[:end], token_logprobs[row, :end].tolist(), finished))
        return generations
