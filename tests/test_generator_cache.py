"""Prefix caching in `HFGenerator`: continuing the previous turn's KV cache gives what a full
prefill gives (same greedy ids, logprobs within 1e-4), and really skips the cached columns."""

from __future__ import annotations

import pytest
import torch
from conftest import CounterEnv

from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from agentgym_rl.envs.tasks import Task
from agentgym_rl.config import RolloutConfig
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.backends import model_policy

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                        max_positions=512)
OPENINGS = ["Your goal: go to the red ball.", "Thought: I should", "Nothing happens. Available actions: look, count",
            "You completed the mission. Counter value is 3."]
MAX_NEW = 8


def _model(tokenizer, seed: int = 0):
    """A tiny Qwen2 whose large random weights make greedy replies varied (the default init
    repeats one token), so that stop tokens end some replies early and not others."""
    model = build_model(tokenizer, SMALL, seed=seed).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    return model


def _end_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|end|>")


def _stop_ids(tokenizer, model) -> list[int]:
    """End-of-turn plus the third greedy token of the first opening: that reply stops early
    while the others (checked by the callers) run to the token limit."""
    dry = HFGenerator(model, tokenizer.pad_token_id, [_end_id(tokenizer)], 0.0, reuse_cache=False)
    return [_end_id(tokenizer), dry.generate([tokenizer.encode(OPENINGS[0])], MAX_NEW)[0].ids[2]]


def _play(generator, tokenizer, turns: int = 4):
    """A scripted multi-turn rollout as the engine builds it: each prompt grows by its reply, an
    end-of-turn id when the reply hit the limit, and an observation delta of its own length;
    episode 1 ends after turn 1 (its row leaves the batch). Returns the generations per turn."""
    end = _end_id(tokenizer)
    prompts = {k: tokenizer.encode(text) for k, text in enumerate(OPENINGS)}
    history = []
    for turn in range(turns):
        keys = sorted(prompts)
        generations = generator.generate([prompts[k] for k in keys], MAX_NEW)
        history.append(dict(zip(keys, generations)))
        for k, gen in zip(keys, generations):
            observation = tokenizer.encode(f"<|user|>\nobs {turn}." + " look" * (k + 1) + "<|end|>\n<|assistant|>\n")
            prompts[k] = prompts[k] + gen.ids + ([] if gen.finished else [end]) + observation
        if turn == 1:
            del prompts[1]
    return history


def _rescored(model, prompt: list[int], ids: list[int]) -> list[float]:
    """The log-probabilities of `ids` after `prompt` under one full forward pass, no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    return logits.float().log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()


def _assert_same(cached, full):
    assert [sorted(turn) for turn in cached] == [sorted(turn) for turn in full]
    for turn_cached, turn_full in zip(cached, full):
        for k, gen in turn_cached.items():
            reference = turn_full[k]
            assert gen.ids == reference.ids and gen.finished == reference.finished
            assert gen.logprobs == pytest.approx(reference.logprobs, abs=1e-4)


class _ForwardLengths:
    """Records the input width of every forward pass of `model` (a public forward pre-hook)."""

    def __init__(self, model):
        self.widths: list[int] = []
        model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.widths.append(kwargs["input_ids"].shape[1])


def test_cached_multi_turn_rollout_equals_full_prefill_and_skips_cached_columns(tiny_tokenizer):
    model = _model(tiny_tokenizer)
    stops = _stop_ids(tiny_tokenizer, model)
    pad = tiny_tokenizer.pad_token_id
    cached_gen = HFGenerator(model, pad, stops, 0.0, reuse_cache=True)
    full_gen = HFGenerator(model, pad, stops, 0.0, reuse_cache=False)
    forwards = _ForwardLengths(model)
    cached = _play(cached_gen, tiny_tokenizer)
    cached_widths, forwards.widths = forwards.widths, []
    full = _play(full_gen, tiny_tokenizer)
    _assert_same(cached, full)
    # The rollout exercised what it claims to: a reply stopped early beside a longer one, and
    # one hit the token limit.
    turn0 = cached[0]
    assert turn0[0].finished and len(turn0[0].ids) < max(len(g.ids) for g in turn0.values())
    assert any(not g.finished and len(g.ids) == MAX_NEW for turn in cached for g in turn.values())
    # Every turn after the first continued the cache: its prefill ran only the new columns.
    prefills_cached = [w for w in cached_widths if w > 1]
    prefills_full = [w for w in forwards.widths if w > 1]
    assert len(prefills_cached) == len(prefills_full) == 4
    assert prefills_cached[0] == prefills_full[0]
    assert all(c < f for c, f in zip(prefills_cached[1:], prefills_full[1:]))
    assert sum(prefills_cached) < sum(prefills_full) / 2
    assert cached_gen.reused_columns > 0 and full_gen.reused_columns == 0
    assert cached_gen.prefilled_columns < full_gen.prefilled_columns / 2


def test_sampling_logprobs_match_a_full_prefill_of_the_same_ids(tiny_tokenizer):
    """At temperature 1 the cached path's logprobs are those of the distribution it sampled from:
    scoring its ids with a fresh full forward pass gives the same values."""
    model = _model(tiny_tokenizer)
    stops = _stop_ids(tiny_tokenizer, model)
    torch.manual_seed(1)
    cached_gen = HFGenerator(model, tiny_tokenizer.pad_token_id, stops, 1.0, reuse_cache=True)
    end = _end_id(tiny_tokenizer)
    prompts = [tiny_tokenizer.encode(text) for text in OPENINGS]
    for turn in range(3):
        generations = cached_gen.generate(prompts, MAX_NEW)
        for prompt, gen in zip(prompts, generations):
            assert gen.logprobs == pytest.approx(_rescored(model, prompt, gen.ids), abs=1e-4)
        prompts = [p + g.ids + ([] if g.finished else [end]) + tiny_tokenizer.encode(f"obs {turn} {k}")
                   for k, (p, g) in enumerate(zip(prompts, generations))]
    assert cached_gen.reused_columns > 0


def test_prompts_extending_no_cached_row_give_the_full_prefill_result(tiny_tokenizer):
    model = _model(tiny_tokenizer)
    pad, stops = tiny_tokenizer.pad_token_id, [_end_id(tiny_tokenizer)]
    cached_gen = HFGenerator(model, pad, stops, 0.0, reuse_cache=True)
    full_gen = HFGenerator(model, pad, stops, 0.0, reuse_cache=False)
    first = [tiny_tokenizer.encode(text) for text in OPENINGS[:2]]
    turn0 = cached_gen.generate(first, MAX_NEW)
    extended = first[0] + turn0[0].ids + [stops[0]] + tiny_tokenizer.encode("obs")
    unrelated = tiny_tokenizer.encode(OPENINGS[2])
    # A new episode beside a continued one joins the cached batch as a row attending to none
    # of the cached columns; a batch extending no row at all is prefilled afresh.
    for batch in ([unrelated, extended], [unrelated, tiny_tokenizer.encode(OPENINGS[3])]):
        cached_gen.generate(first, MAX_NEW)
        reused_before = cached_gen.reused_columns
        got = cached_gen.generate(batch, MAX_NEW)
        want = full_gen.generate(batch, MAX_NEW)
        assert [(g.ids, g.finished) for g in got] == [(g.ids, g.finished) for g in want]
        for g, w in zip(got, want):
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        assert (cached_gen.reused_columns > reused_before) == (batch[1] is extended)


def test_reset_drops_a_cache_made_stale_by_new_weights(tiny_tokenizer):
    model = _model(tiny_tokenizer)
    pad, stops = tiny_tokenizer.pad_token_id, [_end_id(tiny_tokenizer)]
    # Both pinned to one thread: the same prefill must give the same floats.
    cached_gen = HFGenerator(model, pad, stops, 0.0, reuse_cache=True, threads=1)
    prompts = [tiny_tokenizer.encode(text) for text in OPENINGS]
    turn0 = cached_gen.generate(prompts, MAX_NEW)
    next_prompts = [p + g.ids + [stops[0]] + tiny_tokenizer.encode("obs") for p, g in zip(prompts, turn0)]
    model.load_state_dict(_model(tiny_tokenizer, seed=1).state_dict())  # an "update" of the weights
    cached_gen.reset()
    got = cached_gen.generate(next_prompts, MAX_NEW)
    want = HFGenerator(model, pad, stops, 0.0, reuse_cache=False, threads=1).generate(next_prompts, MAX_NEW)
    assert [(g.ids, g.logprobs) for g in got] == [(g.ids, g.logprobs) for g in want]


def test_engine_runs_reset_the_cache_and_match_the_uncached_engine(tiny_tokenizer):
    """Two engine runs with a weight change between them: the second must not continue the
    first run's cache, though its first prompts are the same."""
    model = _model(tiny_tokenizer)
    tasks = [Task("counter", i, "c") for i in range(3)]

    def play(reuse: bool):
        policy = model_policy(model, tiny_tokenizer, 0.0, RolloutConfig(reuse_kv_cache=reuse))
        engine = RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=MAX_NEW))
        runs = [engine.run(tasks, policy, max_turns=3)]
        model.load_state_dict(_model(tiny_tokenizer, seed=1).state_dict())
        runs.append(engine.run(tasks, policy, max_turns=3))
        model.load_state_dict(_model(tiny_tokenizer, seed=0).state_dict())
        return runs, policy.generator

    cached, generator = play(True)
    full, _ = play(False)
    assert generator.reused_columns > 0
    for run_cached, run_full in zip(cached, full):
        assert [t.turns for t in run_cached] == [3, 3, 3]
        for a, b in zip(run_cached, run_full):
            assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_more_episodes_than_the_cached_batch_are_played_in_batches_that_keep_it(tiny_tokenizer):
    """Five episodes, a cache kept for two prompts: the engine plays two at a time (refilling as
    they end), so later turns read the cache; five at once would be prefilled afresh every turn."""
    policy = model_policy(_model(tiny_tokenizer), tiny_tokenizer, 0.0)
    policy.generator.batch_size = 2
    engine = RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=MAX_NEW))
    out = engine.run([Task("counter", i, "c") for i in range(5)], policy, max_turns=3)
    assert [t.turns for t in out] == [3] * 5
    assert policy.generator.reused_columns > 0


def test_engine_resets_a_generator_at_the_start_and_end_of_each_run(tiny_tokenizer):
    from conftest import ScriptedGenerator

    from agentgym_rl.agent.chat import ChatEncoder
    from agentgym_rl.rollout.policy import ModelPolicy

    class Resettable(ScriptedGenerator):
        resets_at_calls: list[int] = []

        def reset(self):
            self.resets_at_calls.append(self.calls)

    encoder = ChatEncoder(tiny_tokenizer)
    generator = Resettable(tiny_tokenizer, ["Action: look"], encoder.end_of_turn_id)
    engine = RolloutEngine(CounterEnv)
    engine.run([Task("counter", 0, "c")], ModelPolicy(generator, encoder), max_turns=2)
    engine.run([Task("counter", 0, "c")], ModelPolicy(generator, encoder), max_turns=2)
    assert generator.resets_at_calls == [0, 2, 2, 4]


def test_one_long_prompt_does_not_widen_every_rows_prefill(tiny_tokenizer, monkeypatch):
    """A long opening and a long observation beside short ones: the leading columns run for the
    long row alone, other rows' cache there is zeros under the mask. Same greedy ids and logprobs
    as the padded prefill, fewer columns run, in the first turn and in continued ones."""
    import agentgym_rl.agent.generator as generator_module

    model = _model(tiny_tokenizer)
    pad, end = tiny_tokenizer.pad_token_id, _end_id(tiny_tokenizer)
    long_text = " ".join(["Available actions: go forward, turn left, pick up the key"] * 4)

    def play(generator):
        prompts = [tiny_tokenizer.encode(long_text), *(tiny_tokenizer.encode(t) for t in OPENINGS[1:])]
        history = []
        for turn in range(3):
            generations = generator.generate(prompts, MAX_NEW)
            history.append(generations)
            observations = [long_text if k == turn % 2 else f"obs {turn}" for k in range(len(prompts))]
            prompts = [p + g.ids + ([] if g.finished else [end]) + tiny_tokenizer.encode(f"<|user|>\n{o}<|end|>\n")
                       for p, g, o in zip(prompts, generations, observations)]
        return history

    split_gen = HFGenerator(model, pad, [end], 0.0, threads=1)
    split = play(split_gen)
    monkeypatch.setattr(generator_module, "MIN_HEAD_SAVING", 2.0)  # never split
    padded_gen = HFGenerator(model, pad, [end], 0.0, threads=1)
    padded = play(padded_gen)
    uncached = play(HFGenerator(model, pad, [end], 0.0, reuse_cache=False, threads=1))
    for turn_split, turn_padded, turn_uncached in zip(split, padded, uncached):
        for a, b, c in zip(turn_split, turn_padded, turn_uncached):
            assert a.ids == b.ids == c.ids and a.finished == b.finished
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
            assert a.logprobs == pytest.approx(c.logprobs, abs=1e-4)
    assert split_gen.reused_columns == padded_gen.reused_columns > 0
    assert split_gen.prefilled_columns < 0.6 * padded_gen.prefilled_columns


def test_a_continued_cache_holds_no_column_that_no_row_attends_to(tiny_tokenizer, monkeypatch):
    """Replies of different lengths, observations of different lengths and an episode that
    ends leave padding in the batch; continuing it re-packs every row to its real columns, so
    the cached width is the longest row's real history, and each layer keeps one buffer."""
    from agentgym_rl.agent.kv_cache import AppendLayer

    model = _model(tiny_tokenizer)
    generator = HFGenerator(model, tiny_tokenizer.pad_token_id, _stop_ids(tiny_tokenizer, model), 0.0, threads=1)
    seen = []
    original = HFGenerator._generate_batch

    def record(self, prompts, max_new_tokens, input_ids, attention, cache, allowed=None, streams=None):
        if cache is not None:
            cached = cache.get_seq_length()
            seen.append((attention[:, :cached].clone(), cache))
            for layer in cache.layers:
                assert isinstance(layer, AppendLayer)
                assert layer.keys.data_ptr() == layer._key_buffer.data_ptr()
                assert layer.values.data_ptr() == layer._value_buffer.data_ptr()
        return original(self, prompts, max_new_tokens, input_ids, attention, cache, allowed, streams)

    monkeypatch.setattr(HFGenerator, "_generate_batch", record)
    cached = _play(generator, tiny_tokenizer, turns=5)
    assert len(seen) == 4
    for kept_mask, _ in seen:
        assert bool(kept_mask.any(dim=0).all())  # every cached column is real in some row
        real = kept_mask.sum(dim=1)
        assert kept_mask.shape[1] == int(real.max())
        for row, count in enumerate(real.tolist()):  # left-packed: padding, then the real columns
            assert kept_mask[row].tolist() == [0] * (kept_mask.shape[1] - count) + [1] * count
    monkeypatch.undo()
    _assert_same(cached, _play(HFGenerator(model, tiny_tokenizer.pad_token_id, _stop_ids(tiny_tokenizer, model),
                                           0.0, reuse_cache=False, threads=1), tiny_tokenizer, turns=5))


def test_grouped_heads_attend_without_copying_keys_and_values(tiny_tokenizer, monkeypatch):
    """SMALL has 2 query heads over 1 key/value head. Left-padded batches always carry a mask,
    where transformers' "sdpa" copies the key/value heads (`repeat_kv`); the generator's model
    attends without that copy and gives the same ids and logprobs as "sdpa" does."""
    import transformers.integrations.sdpa_attention as sdpa

    import agentgym_rl.agent.attention as attention

    copied = []
    original = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda states, n: copied.append(n) or original(states, n))
    reference_model = _model(tiny_tokenizer)
    with monkeypatch.context() as patch:  # transformers' own "sdpa", as the model came
        patch.setattr(attention, "use_grouped_attention", lambda model: None)
        stop = _stop_ids(tiny_tokenizer, reference_model)
        reference = _play(HFGenerator(reference_model, tiny_tokenizer.pad_token_id, stop, 0.0, threads=1),
                          tiny_tokenizer)
    assert reference_model.config._attn_implementation == "sdpa" and copied
    copied.clear()
    model = _model(tiny_tokenizer)
    _assert_same(_play(HFGenerator(model, tiny_tokenizer.pad_token_id, stop, 0.0, threads=1), tiny_tokenizer),
                 reference)
    assert model.config._attn_implementation == attention.NAME and copied == []
    # The same model in training computes the same gradients, with and without a padding mask.
    ids = torch.tensor([tiny_tokenizer.encode(OPENINGS[2])] * 2)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    for m in (model, reference_model):
        m.zero_grad()
        m(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference_model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_decoding_steps_by_stacked_heads_generate_as_sdpa(tiny_tokenizer, monkeypatch):
    """A GPU decodes by `grouped_decode_attention` (agent/attention.py). Sent there on the CPU
    too, a multi-turn rollout with a kept, re-packed cache and rows leaving the batch generates
    the same ids and logprobs as torch's grouped SDPA, and every layer of every decoding step
    (a forward pass of one new id a row, always with a padding mask here) went there."""
    import agentgym_rl.agent.attention as attention

    model = _model(tiny_tokenizer)
    stop = _stop_ids(tiny_tokenizer, model)
    reference = _play(HFGenerator(model, tiny_tokenizer.pad_token_id, stop, 0.0, threads=1), tiny_tokenizer)
    steps = []
    original = attention.grouped_decode_attention

    def recorded(query, *args):
        steps.append(query.shape[2])
        return original(query, *args)

    monkeypatch.setattr(attention, "decodes_stacked", lambda query, dropout: query.shape[2] == 1)
    monkeypatch.setattr(attention, "grouped_decode_attention", recorded)
    forwards = _ForwardLengths(model)
    stacked = _play(HFGenerator(model, tiny_tokenizer.pad_token_id, stop, 0.0, threads=1), tiny_tokenizer)
    _assert_same(stacked, reference)
    decoding = forwards.widths.count(1)
    assert decoding >= 4 * (MAX_NEW - 1) and len(steps) == SMALL.num_layers * decoding


def test_a_continued_head_is_a_few_rows_or_none(tiny_tokenizer, monkeypatch):
    """The head's rows run on a copy of their cached keys and values: with one long observation
    among four rows the head is that row; with three, nothing is split off (the copy would be
    most of the cache)."""
    model = _model(tiny_tokenizer)
    end = _end_id(tiny_tokenizer)
    long_text = " ".join(["Available actions: go forward, turn left, pick up the key"] * 4)
    heads = []
    original = HFGenerator._prefill_head

    def record(self, input_ids, attention, cache):
        columns = original(self, input_ids, attention, cache)
        heads.append((cache.get_seq_length() > 0, columns))
        return columns

    monkeypatch.setattr(HFGenerator, "_prefill_head", record)
    for long_rows, expect_split in ((1, True), (3, False)):
        generator = HFGenerator(model, tiny_tokenizer.pad_token_id, [end], 0.0, threads=1)
        prompts = [tiny_tokenizer.encode(t) for t in OPENINGS]
        generations = generator.generate(prompts, MAX_NEW)
        observations = [long_text if k < long_rows else "obs" for k in range(len(prompts))]
        prompts = [p + g.ids + ([] if g.finished else [end]) + tiny_tokenizer.encode(f"<|user|>\n{o}<|end|>\n")
                   for p, g, o in zip(prompts, generations, observations)]
        heads.clear()
        generator.generate(prompts, MAX_NEW)
        continued = [columns for had_cache, columns in heads if had_cache]
        assert continued and (continued[0] > 0) == expect_split
        assert (generator.copied_columns > 0) == expect_split


def test_an_episode_joining_a_continued_batch_copies_no_cache(tiny_tokenizer):
    """A new episode's long prompt beside three continued rows: its head runs on a fresh cache (it
    has no cached column to attend to), and every reply equals an uncached generator's; the
    head's rows are not capped by `MAX_HEAD_ROW_SHARE` (three new rows of four)."""
    model = _model(tiny_tokenizer)
    end = _end_id(tiny_tokenizer)
    long_text = " ".join(["Available actions: go forward, turn left, pick up the key"] * 4)
    for joining in (1, 3):
        cached = HFGenerator(model, tiny_tokenizer.pad_token_id, [end], 0.0, threads=1)
        uncached = HFGenerator(model, tiny_tokenizer.pad_token_id, [end], 0.0, threads=1, reuse_cache=False)
        prompts = [tiny_tokenizer.encode(t) for t in OPENINGS]
        generations = cached.generate(prompts, MAX_NEW)
        prompts = [p + g.ids + ([] if g.finished else [end]) + tiny_tokenizer.encode("<|user|>\nobs<|end|>\n")
                   for p, g in zip(prompts, generations)]
        for k in range(len(prompts) - joining, len(prompts)):
            prompts[k] = tiny_tokenizer.encode(f"{long_text} {k}")
        prefilled = cached.prefilled_columns
        replies, reference = cached.generate(prompts, MAX_NEW), uncached.generate(prompts, MAX_NEW)
        for a, b in zip(replies, reference):
            assert a.ids == b.ids and a.finished == b.finished
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert cached.reused_columns > 0 and cached.copied_columns == 0
        width = max(len(p) for p in prompts)
        assert cached.prefilled_columns - prefilled < 0.8 * len(prompts) * width  # a head was split off


def test_a_prompt_that_repeats_is_prefilled_once_and_replies_as_it_would_alone(tiny_tokenizer):
    """A GRPO group's samples share their prompt: each distinct prompt of a fresh batch runs once
    (all columns but the last, which `generate` runs for every row), and each row replies as its
    prompt alone would: greedy ids equal, logprobs within 1e-4."""
    model = _model(tiny_tokenizer)
    pad, end = tiny_tokenizer.pad_token_id, _end_id(tiny_tokenizer)
    prompts = [tiny_tokenizer.encode(OPENINGS[k]) for k in (0, 2, 0, 1, 2, 0)]
    generator = HFGenerator(model, pad, [end], 0.0, threads=1)
    grouped = generator.generate(prompts, MAX_NEW)
    width = max(map(len, prompts))
    assert generator.prefilled_columns == 3 * (width - 1) + len(prompts)
    for prompt, generation in zip(prompts, grouped):
        [alone] = HFGenerator(model, pad, [end], 0.0, reuse_cache=False, threads=1).generate([prompt], MAX_NEW)
        assert generation.ids == alone.ids and generation.finished == alone.finished
        assert generation.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_sampled_rows_of_one_prompt_differ_and_continue_their_own_caches(tiny_tokenizer):
    """At temperature 1 the rows of a repeated prompt sample apart from the shared keys and values,
    and the next turn continues each row's cache: every logprob is the full forward pass's."""
    model = _model(tiny_tokenizer)
    pad, end = tiny_tokenizer.pad_token_id, _end_id(tiny_tokenizer)
    generator = HFGenerator(model, pad, [end], 1.0, threads=1)
    prompts = [tiny_tokenizer.encode(OPENINGS[0])] * 4
    for turn in range(2):
        generations = generator.generate(prompts, MAX_NEW, streams=[0, 1, 2, 3])
        if turn == 0:
            assert len({tuple(g.ids) for g in generations}) > 1
        for prompt, generation in zip(prompts, generations):
            assert generation.logprobs == pytest.approx(_rescored(model, prompt, generation.ids), abs=1e-4)
        prompts = [p + g.ids + ([] if g.finished else [end]) + tiny_tokenizer.encode(f"obs {turn}")
                   for p, g in zip(prompts, generations)]
    assert generator.reused_columns > 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_models_own_generation_settings_do_not_reach_the_sampler(tiny_tokenizer, temperature):
    """An instruct model's `generation_config.json` may set a repetition penalty (Qwen2.5's:
    1.05), which transformers would apply to every step: the replies and their log-probabilities
    must be those of softmax(logits / T) all the same, and the model's settings stay its own."""
    model = _model(tiny_tokenizer)
    prompts = [tiny_tokenizer.encode(text) for text in OPENINGS]
    streams = {} if temperature == 0 else {"streams": [11, 12, 13, 14]}

    def replies():
        generator = HFGenerator(model, tiny_tokenizer.pad_token_id, [_end_id(tiny_tokenizer)], temperature,
                                reuse_cache=False)
        return [(g.ids, g.logprobs) for g in generator.generate(prompts, MAX_NEW, **streams)]

    plain = replies()
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.no_repeat_ngram_size = 1
    for (ids, logprobs), (plain_ids, plain_logprobs) in zip(replies(), plain):
        assert ids == plain_ids and torch.allclose(torch.tensor(logprobs), torch.tensor(plain_logprobs), atol=1e-4)
    assert model.generation_config.repetition_penalty == 3.0
