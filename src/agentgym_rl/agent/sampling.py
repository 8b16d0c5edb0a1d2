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
from collections import Counter
from typing import Any, Sequence

MASK64 = (1 << 64) - 1

GREEDY_STREAM = -1
"""The stream of an episode played greedily among sampled ones (`algo.greedy_samples`): its row
gets no noise, so it takes the argmax, as a greedy evaluation does, and its log-probabilities
are still those of softmax(logits / T), as the learner scores it. `episode_stream` never gives it."""


def episode_stream(seed: int, item_id: str, sample: int) -> int:
    """The random stream of sample `sample` of task `item_id` in a run sampled with `seed`: a
    63-bit integer. Not the task's place in the run, so that a worker given some of the tasks
    draws what the whole run would."""
    digest = hashlib.blake2b(f"{seed}/{item_id}/{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _signed(constant: int) -> int:
    """A 64-bit constant as the int64 whose bits it is (torch multiplies int64 modulo 2**64)."""
    return constant - (1 << 64) if constant >= 1 << 63 else constant


_GOLDEN, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def position_seed(stream: int, position: int) -> int:
    """The seed of the draw for the token at `position` of the stream's episode (SplitMix64's
    finaliser over stream and position: neighbouring positions get unrelated seeds)."""
    z = (stream + (position + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) >> 1


def _shift_right(x: Any, bits: int, out: Any) -> Any:
    """out = x >>> bits: the logical shift of int64 bits (torch's >> keeps the sign)."""
    import torch

    torch.bitwise_right_shift(x, bits, out=out)
    return out.bitwise_and_((1 << (64 - bits)) - 1)


def position_seeds(streams: Any, positions: Any) -> Any:
    """`position_seed` of each row, computed where the tensors are: (B,) int64 streams and (B,)
    int64 positions -> (B,) int64 seeds, equal to the Python function's. On a GPU no row's seed
    is made on the host, and the call has fixed shapes (what a CUDA graph captures)."""
    import torch

    z = streams + (positions + 1) * _GOLDEN  # int64 arithmetic wraps modulo 2**64
    scratch = torch.empty_like(z)
    z = (z ^ _shift_right(z, 30, scratch)) * _MIX1
    z = (z ^ _shift_right(z, 27, scratch)) * _MIX2
    z = z ^ _shift_right(z, 31, scratch)
    return _shift_right(z, 1, scratch)


def greedy_members(groups: Sequence[int], greedy_samples: int) -> list[bool]:
    """Which of a run's episodes, listed group by group with each group's samples in their order
    (as `RolloutEngine.run` returns them; `group` the group of each), were played greedily: the
    first `greedy_samples` of each group (`algo.greedy_samples`)."""
    taken: Counter[int] = Counter()
    greedy = []
    for group in groups:
        greedy.append(taken[group] < greedy_samples)
        taken[group] += 1
    return greedy


def stream_noise(streams: Any, positions: Any, size: int) -> Any:
    """(B, size) float64 Gumbel noise of each row's stream at its position (`gumbel_noise` of
    `position_seeds`), zero on the rows whose stream is `GREEDY_STREAM`. streams, positions: (B,)
    int64 tensors; no value is read on the host (a CUDA graph can hold it)."""
    noise = gumbel_noise(position_seeds(streams, positions), size)
    return noise.masked_fill_((streams == GREEDY_STREAM).unsqueeze(1), 0.0)


def rows_per_pass(device_type: str, rows: int) -> int:
    """The rows `gumbel_noise` makes at once by default: all of them off the CPU; on it 4, which
    keep the int64 scratch in cache (128 rows: ~0.1 s, not ~0.7)."""
    return rows if device_type != "cpu" else 4


def gumbel_noise(seeds: list[int] | Any, size: int, device: Any = None, rows_at_once: int | None = None) -> Any:
    """(len(seeds), size) float64 standard Gumbel noise; row i is a function of seeds[i] alone.
    `seeds`: Python ints, or a (B,) int64 tensor (`position_seeds`; its device is used).
    `rows_at_once`: rows made per pass (None: all of them off the CPU, 4 on it).

    A counter-based generator: entry (i, v) is SplitMix64's output for state seeds[i] + (v + 1) *
    golden gamma (Steele, Lea & Flood 2014), its top 53 bits a uniform u in (0, 1), and the noise
    -log(-log u). Integer arithmetic modulo 2**64 gives the same bits on every device, and all
    rows are made by a few vectorised operations where they are needed: on a GPU, a generator
    seeded per row on the CPU cost more than the model's own decoding step (0.125 s a step for 128
    rows of SmolLM2's 49,152 tokens on one core, docs/BENCHMARKS.md).
    """
    import torch

    if isinstance(seeds, torch.Tensor):
        device = seeds.device
    else:
        seeds = torch.tensor(seeds, dtype=torch.int64, device=device)
    counters = torch.arange(1, size + 1, dtype=torch.int64, device=device).mul_(_GOLDEN)
    noise = torch.empty(len(seeds), size, dtype=torch.float64, device=device)
    chunk = rows_at_once or rows_per_pass(noise.device.type, len(seeds))
    for start in range(0, len(seeds), chunk):
        rows = seeds[start:start + chunk].unsqueeze(1)
        x = counters.unsqueeze(0) + rows
        scratch = torch.empty_like(x)
        x.bitwise_xor_(_shift_right(x, 30, scratch)).mul_(_MIX1)
        x.bitwise_xor_(_shift_right(x, 27, scratch)).mul_(_MIX2)
        x.bitwise_xor_(_shift_right(x, 31, scratch))
        uniform = noise[start:start + chunk].copy_(_shift_right(x, 11, scratch)).add_(0.5).mul_(2.0 ** -53)
        uniform.log_().neg_().log_().neg_()
    return noise


class StreamSampler:
    """A transformers logits processor that turns greedy decoding into sampling at `temperature`
    from each row's own stream, recording the sampled tokens' log-probabilities.

    Put it last (after any processor that masks tokens): the log-probabilities are those of
    softmax(scores / temperature) over the scores it receives.

    Args:
        streams: one stream per row (`episode_stream`, or `GREEDY_STREAM` for a row decoded greedily).
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
        self._rows: tuple[Any, Any] | None = None  # (streams, positions) as int64 tensors, on the scores' device

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self._rows is None:  # once: then each step's seeds are made on the scores' device
            self._rows = tuple(torch.tensor(values, dtype=torch.int64, device=scores.device)
                               for values in (self.streams, self.positions))
        streams, positions = self._rows
        step = len(self.logprobs)
        tempered = scores.float() / self.temperature
        noise = stream_noise(streams, positions + step, scores.shape[-1])
        noised = tempered.double() + noise
        chosen = noised.argmax(-1, keepdim=True)
        self.logprobs.append(tempered.log_softmax(-1).gather(-1, chosen).squeeze(-1))
        return noised


class GreedyLogprobs:
    """A transformers logits processor for greedy decoding that records the log-probability of
    the token greedy decoding picks at each position (the largest of softmax(scores)), so that
    `generate` need not keep every position's (B, V) scores to compute them afterwards (for
    SmolLM2, 8 rows and 48 positions: 75 MB, and as much again for their log-softmax).

    Put it last (after any processor that masks tokens); it returns the scores unchanged.
    """

    def __init__(self) -> None:
        self.logprobs: list[Any] = []
        """One (B,) tensor per generated position: the log-probability of the greedy token."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.logprobs.append(scores.float().log_softmax(-1).amax(-1))
        return scores

