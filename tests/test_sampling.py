"""Per-episode random streams (`agent/sampling.py`): the Gumbel-max sampler draws from
softmax(scores / T), an episode samples the same whatever it is batched with, and the rollout
engine gives every episode its own stream from (seed, task, sample)."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.sampling import (GREEDY_STREAM, StreamSampler, episode_stream, greedy_members, gumbel_noise,
                                        position_seed, position_seeds, rows_per_pass, stream_noise)
from agentgym_rl.agent.tiny import TinyModelConfig, build_model


def test_streams_and_position_seeds_are_pure_and_distinct():
    assert episode_stream(0, "babyai_3", 1) == episode_stream(0, "babyai_3", 1)
    others = {episode_stream(1, "babyai_3", 1), episode_stream(0, "babyai_4", 1), episode_stream(0, "babyai_3", 2)}
    assert episode_stream(0, "babyai_3", 1) not in others and len(others) == 3
    seeds = [position_seed(12345, p) for p in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**63 for s in seeds)


def _splitmix64_gumbel(seed: int, index: int) -> float:
    """Entry `index` of a row's noise, written out from SplitMix64's definition in Python ints."""
    mask = (1 << 64) - 1
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return -math.log(-math.log(((z >> 11) + 0.5) * 2.0 ** -53))


def test_the_noise_is_splitmix64_per_row_and_a_row_ignores_its_batch_mates():
    seeds = [7, 2**63 - 1, 0, 123456789, 5, 6]  # 2**63 - 1: int64 arithmetic wraps and shifts logically
    noise = gumbel_noise(seeds, 300)
    assert noise.shape == (6, 300) and noise.dtype == torch.float64
    for row, seed in enumerate(seeds):
        expected = torch.tensor([_splitmix64_gumbel(seed, v) for v in range(300)], dtype=torch.float64)
        assert torch.allclose(noise[row], expected, rtol=0, atol=1e-12), seed
    assert torch.equal(gumbel_noise([123456789], 300)[0], noise[3])  # alone or in a chunk with others
    assert not torch.equal(noise[0], noise[4])
    # standard Gumbel: mean Euler's gamma, variance pi^2 / 6 (200,000 draws, 5 standard errors)
    many = gumbel_noise([11, 12], 100_000).flatten()
    assert abs(many.mean().item() - 0.5772156649) < 5 * math.sqrt(math.pi**2 / 6 / many.numel())
    assert abs(many.var().item() - math.pi**2 / 6) < 0.05


def test_the_sampler_draws_from_the_tempered_softmax_and_records_its_logprobs():
    """20,000 draws (each a row with its own stream) over logits (2, 1, 0, -inf) at T = 0.5:
    frequencies within 4 standard errors of softmax(logits / T); a masked token is never drawn;
    the recorded logprob is log softmax(logits / T) of the drawn token."""
    logits = torch.tensor([2.0, 1.0, 0.0, -math.inf])
    rows = 20_000
    sampler = StreamSampler(list(range(rows)), [3] * rows, temperature=0.5)
    noised = sampler(None, logits.expand(rows, 4).clone())
    drawn = noised.argmax(-1)
    expected = torch.softmax(logits / 0.5, -1)
    frequencies = torch.bincount(drawn, minlength=4).double() / rows
    standard_errors = (expected * (1 - expected) / rows).sqrt()
    assert frequencies[3] == 0
    assert torch.all((frequencies[:3] - expected[:3]).abs() < 4 * standard_errors[:3] + 1e-12), frequencies
    assert torch.allclose(sampler.logprobs[0], expected.log()[drawn].float())
    second = sampler(None, logits.expand(rows, 4).clone())  # the next position: other draws
    assert len(sampler.logprobs) == 2 and not torch.equal(second.argmax(-1), drawn)
    with pytest.raises(ValueError, match="temperature"):
        StreamSampler([1], [0], temperature=0.0)


def test_a_row_samples_the_same_whatever_it_is_batched_with(tiny_tokenizer):
    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, max_positions=128))
    end = tiny_tokenizer.eos_token_id
    generator = HFGenerator(model, tiny_tokenizer.pad_token_id, [end], temperature=1.0, threads=1, reuse_cache=False)
    mine, other, third = ([5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21])
    alone = generator.generate([mine], 12, streams=[42])[0]
    torch.manual_seed(0)  # the process' random state plays no part
    batched = generator.generate([other, mine, third], 12, streams=[7, 42, 9])
    assert batched[1].ids == alone.ids
    assert batched[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert generator.generate([mine], 12, streams=[43])[0].ids != alone.ids  # another stream, another sample
    assert all(lp <= 0 for lp in alone.logprobs) and len(alone.ids) == len(alone.logprobs)


def test_greedy_replies_record_the_chosen_tokens_logprobs_without_keeping_the_scores(tiny_tokenizer, monkeypatch):
    """A greedy reply's logprobs are log softmax of one forward pass over prompt + reply at the
    reply's tokens, each the largest there (greedy), and `generate` is not asked for the scores."""
    import transformers

    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, max_positions=128))
    end = tiny_tokenizer.eos_token_id
    generator = HFGenerator(model, tiny_tokenizer.pad_token_id, [end], temperature=0.0, threads=1, reuse_cache=False)
    asked = []
    original = transformers.GenerationMixin.generate

    def generate(self, *args, generation_config=None, **kwargs):
        asked.append(generation_config.output_scores)
        return original(self, *args, generation_config=generation_config, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12]]
    replies = generator.generate(prompts, 10)
    assert asked == [False]
    for prompt, reply in zip(prompts, replies):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + reply.ids])).logits[0, len(prompt) - 1:-1].float()
        logprobs = logits.log_softmax(-1)
        chosen = logprobs.gather(-1, torch.tensor(reply.ids)[:, None]).squeeze(-1)
        assert reply.ids == logits.argmax(-1).tolist()
        assert reply.logprobs == pytest.approx(chosen.tolist(), abs=1e-4)


def test_seeds_made_on_the_device_equal_the_python_ones():
    streams = [0, 1, 12345, 2**63 - 1, episode_stream(0, "babyai_3", 1), 2**62 + 7]
    positions = [0, 1, 7, 2**31, 65_535, 10**12]
    pairs = [(s, p) for s in streams for p in positions]
    seeds = position_seeds(torch.tensor([s for s, _ in pairs]), torch.tensor([p for _, p in pairs]))
    assert seeds.dtype == torch.int64 and seeds.tolist() == [position_seed(s, p) for s, p in pairs]
    assert torch.equal(gumbel_noise(seeds, 50), gumbel_noise([position_seed(s, p) for s, p in pairs], 50))


def test_greedy_members_are_each_groups_first_samples():
    groups = [0, 0, 0, 1, 1, 2]
    assert greedy_members(groups, 0) == [False] * 6
    assert greedy_members(groups, 1) == [True, False, False, True, False, True]
    assert greedy_members(groups, 2) == [True, True, False, True, True, True]


def test_off_the_cpu_the_noise_is_made_for_all_rows_at_once():
    """A GPU makes all rows in one pass (`rows_at_once` None there), the CPU four at a time: the
    one-pass path, forced on the CPU, gives the same noise bit for bit."""
    seeds = torch.tensor([position_seed(7, p) for p in range(9)])
    assert torch.equal(gumbel_noise(seeds, 40, rows_at_once=9), gumbel_noise(seeds, 40))
    assert torch.equal(gumbel_noise(seeds, 40, rows_at_once=1), gumbel_noise(seeds, 40))
    assert rows_per_pass("cuda", 9) == 9 and rows_per_pass("cpu", 9) == 4  # the default each device takes


def test_a_greedy_stream_gets_no_noise_and_the_others_theirs():
    streams, positions = torch.tensor([GREEDY_STREAM, 42]), torch.tensor([5, 5])
    noise = stream_noise(streams, positions, 16)
    assert torch.equal(noise[0], torch.zeros(16, dtype=torch.float64))
    assert torch.equal(noise[1], gumbel_noise(position_seeds(streams[1:], positions[1:]), 16)[0])


@pytest.mark.parametrize("kind", ["hf", "slots"])
def test_a_greedy_row_among_sampled_ones_decodes_greedily_with_the_tempered_logprobs(tiny_tokenizer, kind):
    """`algo.greedy_samples`' episodes: in a sampled batch, the row of `GREEDY_STREAM` writes what a
    greedy generator writes, its logprobs those of softmax(logits / T) (as the learner scores
    them), and its batch-mate samples what it samples alone."""
    from agentgym_rl.agent.slot_generator import SlotGenerator

    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, max_positions=128))
    end, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id

    def generator(temperature):
        if kind == "slots":
            return SlotGenerator(model, pad, [end], temperature, slots=4, max_len=64)
        return HFGenerator(model, pad, [end], temperature=temperature, threads=1, reuse_cache=False)

    mine, other = [5, 6, 7, 8, 9, 10], [11, 12, 13]
    greedy = generator(0.0).generate([mine], 12)[0]
    sampled = generator(0.7)
    batched = sampled.generate([mine, other], 12, streams=[GREEDY_STREAM, 42])
    assert batched[0].ids == greedy.ids
    assert batched[1].ids == sampled.generate([other], 12, streams=[42])[0].ids
    assert sampled.generate([mine], 12, streams=[42])[0].ids != greedy.ids  # a sampled row would differ
    with torch.no_grad():
        logits = model(torch.tensor([mine + greedy.ids])).logits[0, len(mine) - 1:-1].float()
    tempered = (logits / 0.7).log_softmax(-1).gather(-1, torch.tensor(greedy.ids)[:, None]).squeeze(-1)
    assert batched[0].logprobs == pytest.approx(tempered.tolist(), abs=1e-4)
