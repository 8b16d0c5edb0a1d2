"""Sampling from an episode's own random stream.

Sampled over a batch from one generator, an episode's tokens depend on the episodes batched with
it: how many rows drew before it, how long the others ran. A resumed episode (its batch-mates
finished or never restarted) or one played in another worker would then sample something else.
Here each episode has a stream (`episode_stream`, from the run's seed, the task and the sample),
and the token at position p of its conversation is drawn with noise that is a function of
(stream, p) alone, by the Gumbel-max trick: argmax(logits / T + G), G standard Gumbel noise, is a
sample of softmax(logits / T) (Gumbel 1954; Maddison et al. 2014, "A* Sampling"). transformers
then decodes greedily over the noised scores.
"""

from __future__ import annotations

import hashlib
from typing import Any

MASK64 = (1 << 64) - 1


def episode_stream(seed: int, item_id: str, sample: int) -> int:
    """The random stream of sample `sample` of task `item_id` in a run sampled with `seed`: a
    63-bit integer. Not the task's place in the run, so that a worker given some of the tasks
    draws what the whole run would."""
    digest = hashlib.blake2b(f"{seed}/{item_id}/{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def position_seed(stream: int, position: int) -> int:
    """The seed of the draw for the token at `position` of the stream's episode (SplitMix64's
    finaliser over stream and position: neighbouring positions get unrelated seeds)."""
    z = (stream + (position + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) >> 1


def gumbel_noise(seed: int, size: int) -> Any:
    """(size,) float64 standard Gumbel noise, a function of `seed` alone."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    uniform = torch.rand(size, generator=generator, dtype=torch.float64).clamp_(min=1e-300)
    return -torch.log(-torch.log(uniform))


class StreamSampler:
    """A transformers logits processor that turns greedy decoding into sampling at `temperature`
    from each row's own stream, recording the sampled tokens' log-probabilities.

    Put it last (after any processor that masks tokens): the log-probabilities are those of
    softmax(scores / temperature) over the scores it receives.

    Args:
        streams: one stream per row (`episode_stream`).
        positions: where in its episode each row's first new token goes (its prompt's length).
        temperature: > 0.
    """

    def __init__(self, streams: list[int], positions: list[int], temperature: float):
        if temperature <= 0:
            raise ValueError(f"a stream sampler samples: temperature must be > 0, got {temperature}")
        if len(streams) != len(positions):
            raise ValueError(f"{len(streams)} streams for {len(positions)} rows")
        self.streams, self.positions, self.temperature = list(streams), list(positions), temperature
        self.logprobs: list[Any] = []
        """One (B,) tensor per generated position: the log-probability of the token sampled there."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        step = len(self.logprobs)
        tempered = scores.float() / self.temperature
        noise = torch.stack([gumbel_noise(position_seed(stream, position + step), scores.shape[-1])
                             for stream, position in zip(self.streams, self.positions)]).to(scores.device)
        noised = tempered.double() + noise
        chosen = noised.argmax(-1, keepdim=True)
        self.logprobs.append(tempered.log_softmax(-1).gather(-1, chosen).squeeze(-1))
        return noised
