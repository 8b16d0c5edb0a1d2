"""The slot cache (`agent/slot_cache.py`) and the generator over it (`agent/slot_generator.py`),
the first slice of the CUDA-graph decoding backend, on the CPU: rows at their own positions give
the logits of separate forwards, and replies equal `HFGenerator`'s for the same prompts and
streams, greedy and sampled, over a second turn that runs only its new tokens."""

from __future__ import annotations

import contextlib
import dataclasses
import types
import warnings

import pytest
import torch

from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.slot_cache import SlotCache
from agentgym_rl.agent.slot_generator import SlotGenerator
from agentgym_rl.agent.tiny import TinyModelConfig, build_model

SHAPE = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                        intermediate_size=64, max_positions=512)
STOP = 7


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SHAPE, seed=0).eval()
    with torch.no_grad():  # weights large enough that replies differ from prompt to prompt
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    return model


def test_rows_at_their_own_positions_give_the_logits_of_separate_forwards(model):
    """Three rows of different lengths, left-padded, and a slot given only padding: each row's
    next-token logits equal an unbatched forward's, at the prefill and at a decoding step."""
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    cache = SlotCache(SHAPE.num_layers, 4, 32)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts] + [[0] * width])
    pads = torch.tensor([width - len(p) for p in prompts] + [width])
    positions, mask = cache.step(width, pads)
    assert positions.tolist()[1] == [0, 0, 0, 0, 1] and mask.shape == (4, 1, width, 32)
    assert cache.columns.tolist()[1] == [31, 31, 31, 0, 1]  # pads into the last column, seen by no real token
    with torch.no_grad():
        first = model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache).logits
        cache.advance(width - pads)
        positions, mask = cache.step(1)
        assert positions[:, 0].tolist() == [5, 2, 3, 0]
        second = model(input_ids=torch.tensor([[3], [4], [1], [0]]), position_ids=positions, attention_mask=mask,
                       past_key_values=cache).logits
        for row, prompt in enumerate(prompts):
            alone = model(input_ids=torch.tensor([prompt + [[3], [4], [1]][row]])).logits[0]
            torch.testing.assert_close(first[row, -1], alone[-2], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(second[row, 0], alone[-1], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(first).all() and torch.isfinite(second).all()


def _replies(generations):
    return [(g.ids, g.finished) for g in generations]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replies_equal_hf_generators_over_two_turns(model, tiny_tokenizer, temperature):
    """Three episodes, one a second sample of another's prompt (a group), sampled from their own
    streams; turn 2 extends each turn-1 conversation: the slot generator runs only the new tokens."""
    pad = tiny_tokenizer.pad_token_id
    hf = HFGenerator(model, pad, [STOP], temperature, reuse_cache=True, threads=1)
    slots = SlotGenerator(model, pad, [STOP], temperature, slots=4, max_len=128)
    first = [[20, 21, 22, 23], [30, 31], [20, 21, 22, 23]]
    streams = [11, 12, 13] if temperature else None
    expected, got = hf.generate(first, 12, streams=streams), slots.generate(first, 12, streams=streams)
    assert _replies(got) == _replies(expected)
    for mine, theirs in zip(got, expected):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
    assert slots.prefilled_columns == 4 + 2  # the repeated prompt was run once
    second = [prompt + generation.ids + [STOP, 40 + i, 41] for i, (prompt, generation) in enumerate(zip(first, got))]
    run_before = slots.prefilled_columns
    expected, got = hf.generate(second, 12, streams=streams), slots.generate(second, 12, streams=streams)
    assert _replies(got) == _replies(expected)
    for mine, theirs in zip(got, expected):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
    # Only what each conversation added since its last cached token was run: the last reply id and 3 more.
    assert slots.prefilled_columns - run_before == 4 * len(second)
    assert any(len(g.ids) > 1 for g in got)


def test_a_row_samples_the_same_whatever_else_is_in_the_batch(model, tiny_tokenizer):
    pad = tiny_tokenizer.pad_token_id
    together = SlotGenerator(model, pad, [STOP], 1.0, slots=3, max_len=64).generate(
        [[20, 21], [30, 31, 32], [5]], 10, streams=[1, 2, 3])
    alone = SlotGenerator(model, pad, [STOP], 1.0, slots=1, max_len=64).generate([[30, 31, 32]], 10, streams=[2])
    assert together[1].ids == alone[0].ids


def test_a_conversation_longer_than_a_slot_is_refused(model, tiny_tokenizer):
    with pytest.raises(ValueError, match="pass the slots' 15 tokens"):
        SlotGenerator(model, tiny_tokenizer.pad_token_id, [STOP], 0.0, slots=2, max_len=16).generate([[1] * 10], 8)


def test_a_training_run_with_the_slot_generator_is_the_hf_run(tmp_path, counter_env_registered):
    """`rollout.generator: slots` samples what "hf" samples from the same streams, so two toy
    GRPO steps give the same metrics (but timings and the generator-learner logprob gap)."""
    import json

    from test_run_safety import toy_config

    from agentgym_rl.train.rl import RLTrainer

    rows = {}
    for generator in ("hf", "slots"):
        config = toy_config(tmp_path, f"run.name={generator}", f"rollout.generator={generator}", "train.steps=2",
                            "rollout.threads=1", "rollout.max_new_tokens=4")
        RLTrainer(config, log=lambda _: None).fit()
        rows[generator] = [{k: v for k, v in json.loads(line).items()
                            if not k.startswith(("time/", "rollout/logprob_gap"))}
                           for line in (tmp_path / generator / "metrics.jsonl").read_text().splitlines()]
    assert rows["slots"] == rows["hf"]
    assert any(row.get("update/grad_norm", 0) > 0 for row in rows["hf"])


def test_a_prefill_of_some_slots_leaves_the_others_as_they_were(model):
    """`rows`: a forward over two of four slots writes theirs only; the others keep their keys."""
    cache = SlotCache(SHAPE.num_layers, 4, 16)
    with torch.no_grad():
        positions, mask = cache.step(3)
        model(input_ids=torch.arange(10, 22).view(4, 3), position_ids=positions, attention_mask=mask,
              past_key_values=cache)
        cache.advance(torch.full((4,), 3))
        before = [layer.keys.clone() for layer in cache.layers]
        rows = torch.tensor([2, 0])
        positions, mask = cache.step(2, torch.tensor([0, 1]), rows)
        assert positions.tolist() == [[3, 4], [2, 3]] and cache.columns.tolist() == [[3, 4], [15, 3]]
        model(input_ids=torch.tensor([[5, 6], [0, 7]]), position_ids=positions, attention_mask=mask,
              past_key_values=cache)
        cache.advance(torch.tensor([2, 1]))
    assert cache.lengths.tolist() == [4, 3, 5, 3]
    for layer, old in zip(cache.layers, before):
        assert torch.equal(layer.keys[[1, 3]], old[[1, 3]])
        assert torch.equal(layer.keys[0, :, :3], old[0, :, :3]) and not torch.equal(layer.keys[0, :, 3], old[0, :, 3])


def test_stops_checked_every_few_steps_give_the_same_replies_with_fewer_host_looks(model, tiny_tokenizer):
    """The host looks at whether any row still replies only every `stop_check_every` steps (a
    device sync each off the CPU): rows that stopped idle in between, and every reply, logprob
    and the next turn's cache are those of checking every step, and the replies `HFGenerator`'s. The stop ids are tokens the rows
    sample, so that they stop at different steps."""
    pad = tiny_tokenizer.pad_token_id
    prompts, streams = [[20, 21, 22, 23], [30, 31], [50, 51, 52]], [3, 4, 5]
    free = SlotGenerator(model, pad, [], 1.0, slots=4, max_len=128).generate(prompts, 10, streams=streams)
    stops = [free[0].ids[2], free[1].ids[5]]
    every, fourth = (SlotGenerator(model, pad, stops, 1.0, slots=4, max_len=128, stop_check_every=k) for k in (1, 4))
    hf = HFGenerator(model, pad, stops, 1.0, reuse_cache=True, threads=1)
    for turn in range(2):
        got = [generator.generate(prompts, 10, streams=streams) for generator in (every, fourth)]
        assert _replies(got[0]) == _replies(got[1]) == _replies(hf.generate(prompts, 10, streams=streams))
        if turn == 0:  # rows stopped at different steps, and one ran to the limit or stopped late
            assert len({len(g.ids) for g in got[0]}) > 1 and got[0][0].finished and len(got[0][0].ids) <= 3
        for mine, theirs in zip(*got):  # rounding aside: the checks compact the batch at different steps
            assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
        assert every._cache.lengths.tolist() == fourth._cache.lengths.tolist()
        if turn == 0:  # the next turn continues each row's cache: all it holds, the last sampled id aside
            held = sum(len(p) + len(g.ids) - 1 for p, g in zip(prompts, got[0]))
        prompts = [p + g.ids + [STOP, 60] for p, g in zip(prompts, got[0])]
    assert every.reused_columns == fourth.reused_columns == held
    assert fourth.host_checks < every.host_checks
    with pytest.raises(ValueError, match="stop_check_every"):
        SlotGenerator(model, pad, [STOP], slots=2, stop_check_every=0)


def test_idle_decoding_steps_leave_every_slot_as_it_was(model, tiny_tokenizer):
    """A CUDA graph is captured after warm-up steps run with every row idle, between two calls:
    they must change nothing the next turn reads. On the CPU, the same steps, eagerly."""
    pad = tiny_tokenizer.pad_token_id
    first = [[20, 21, 22, 23], [30, 31]]
    plain, idled = (SlotGenerator(model, pad, [STOP], 1.0, slots=3, max_len=64) for _ in range(2))
    assert not idled._wants_graphs(next(model.parameters()).device)  # the CPU decodes eagerly
    replies = [generator.generate(first, 6, streams=[1, 2]) for generator in (plain, idled)]
    assert _replies(replies[0]) == _replies(replies[1])
    lengths = idled._cache.lengths.tolist()
    idled._idle_steps(idled._state.leading(idled._cache.batch), 3)
    assert idled._cache.lengths.tolist() == lengths
    second = [p + g.ids + [STOP, 61] for p, g in zip(first, replies[0])]
    assert _replies(plain.generate(second, 6, streams=[1, 2])) == _replies(idled.generate(second, 6, streams=[1, 2]))
    assert idled._graphs == {}


class _FakeCuda:
    """What `SlotGenerator._capture` calls of `torch.cuda`, on the CPU: a graph "captured" over
    the decode state's tensors as they are at capture time, and replayed as that eager step on
    those same tensors (a real graph replays its kernels on the memory it captured). With
    `fail`, capturing raises as a host sync inside a capture does."""

    def __init__(self, generator, fail: bool = False):
        self.generator, self.fail, self.replays = generator, fail, 0
        self.pools = []
        """The pool each capture was given, in order."""

    def install(self, monkeypatch):
        for name in ("Stream", "current_stream", "stream", "CUDAGraph", "graph", "graph_pool_handle"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def graph_pool_handle(self):
        return object()  # torch's is an opaque token; each call a new pool

    class Stream:
        def wait_stream(self, other):
            pass

    def current_stream(self):
        return self.Stream()

    def stream(self, stream):
        return contextlib.nullcontext()

    def CUDAGraph(self):  # noqa: N802 (torch's name)
        return types.SimpleNamespace(replay=None)

    @contextlib.contextmanager
    def graph(self, graph, pool=None):
        self.pools.append(pool)
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        yield  # the captured step runs here once, every row idle
        cache = self.generator._cache
        captured = self.generator._state.leading(cache.batch)  # the tensors, not their values
        width, batch = cache.width, cache.batch  # a real graph's shapes are its buckets'

        def replay():
            assert (cache.width, cache.batch) == (width, batch), "a graph replayed at other buckets"
            self.replays += 1
            self.generator._decode_step(captured)

        graph.replay = replay


@pytest.mark.parametrize("fail", [False, True])
def test_a_captured_step_replays_what_the_eager_step_does(model, tiny_tokenizer, monkeypatch, fail):
    """The CUDA-graph path on the CPU with a stand-in for torch.cuda: replaying the step captured
    over the decode state gives the eager replies over two turns and calls of other lengths, and
    the graphs over one decode state share a memory pool; a step that cannot be captured leaves
    decoding eager, with one warning."""
    pad = tiny_tokenizer.pad_token_id
    eager = SlotGenerator(model, pad, [STOP], 1.0, slots=3, max_len=160)
    graphed = SlotGenerator(model, pad, [STOP], 1.0, slots=3, max_len=160, cuda_graphs=True)
    fake = _FakeCuda(graphed, fail)
    monkeypatch.setattr(graphed, "_wants_graphs", lambda device: not graphed._graphs_failed)
    fake.install(monkeypatch)
    prompts = [[20, 21, 22, 23], [30, 31]]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for new_tokens, observation in ((6, [61]), (9, [62] * 50), (4, [63])):  # the third call: a wider bucket
            expected = eager.generate(prompts, new_tokens, streams=[1, 2])
            assert _replies(graphed.generate(prompts, new_tokens, streams=[1, 2])) == _replies(expected)
            prompts = [p + g.ids + [STOP, *observation] for p, g in zip(prompts, expected)]
    assert graphed.reused_columns == eager.reused_columns > 0
    assert sorted(graphed._graphs) == ([] if fail else [(64, 2), (96, 2)])
    if fail:
        assert graphed._graphs == {} and fake.replays == 0
        assert [str(w.message) for w in said if "CUDA graph" in str(w.message)] == [
            "decoding steps could not be captured as a CUDA graph; decoding eagerly (operation not permitted when "
            "stream is capturing)"]
    else:
        assert graphed._graphs and fake.replays > 0 and not said
        # the second call's longer replies rebuild the decode state, dropping the first call's graph:
        # the two graphs held since share one memory pool, and not the dropped one's
        first, *held = fake.pools
        assert len(held) == 2 and held[0] is held[1] is not None and first not in (None, held[0])



def test_a_captured_step_decodes_a_greedy_row_among_sampled_ones(model, tiny_tokenizer, monkeypatch):
    """`algo.greedy_samples` on the CUDA-graph path (the torch.cuda stand-in): the captured step
    masks the noise of the `GREEDY_STREAM` row as the eager step does, so it writes the greedy
    generator's reply, and its sampled batch-mate keeps its own."""
    from agentgym_rl.agent.sampling import GREEDY_STREAM

    pad = tiny_tokenizer.pad_token_id
    graphed = SlotGenerator(model, pad, [STOP], 1.0, slots=2, max_len=160, cuda_graphs=True)
    fake = _FakeCuda(graphed, False)
    monkeypatch.setattr(graphed, "_wants_graphs", lambda device: True)
    fake.install(monkeypatch)
    prompts = [[20, 21, 22, 23], [30, 31]]
    got = graphed.generate(prompts, 8, streams=[GREEDY_STREAM, 2])
    greedy = SlotGenerator(model, pad, [STOP], 0.0, slots=2, max_len=160).generate(prompts[:1], 8)
    sampled = SlotGenerator(model, pad, [STOP], 1.0, slots=2, max_len=160).generate(prompts[1:], 8, streams=[2])
    assert fake.replays > 0
    assert _replies(got) == _replies(greedy + sampled)

def test_off_the_cpu_stops_are_checked_every_few_steps_and_steps_are_graphed():
    """The GPU defaults, read on the CPU: a model whose weights live off the CPU (here on torch's
    meta device) checks stops every `STOP_CHECK_EVERY` steps; a CUDA device wants graphs unless
    told otherwise or a capture failed; the CPU never does."""
    from agentgym_rl.agent.slot_generator import STOP_CHECK_EVERY

    off_cpu = torch.nn.Linear(2, 2, device="meta")
    generator = SlotGenerator(off_cpu, 0, [STOP], slots=2)
    assert generator.stop_check_every == STOP_CHECK_EVERY > 1
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert generator._wants_graphs(cuda) and not generator._wants_graphs(cpu)
    assert not SlotGenerator(off_cpu, 0, [STOP], slots=2, cuda_graphs=False)._wants_graphs(cuda)
    generator._graphs_failed = True
    assert not generator._wants_graphs(cuda)


def test_the_context_bucket_by_hand():
    from agentgym_rl.agent.slot_generator import context_width

    assert [context_width(columns, 4096) for columns in (1, 64, 65, 97, 129, 700, 1000, 4096, 5000)] == [
        64, 64, 96, 128, 192, 768, 1024, 4096, 4096]
    assert context_width(13, 48) == 48  # never past the slots


def test_a_slot_past_a_calls_context_bucket_is_left_as_it_was(model, tiny_tokenizer):
    """A long conversation's slot sits idle through a call of short prompts, whose attention
    reads 64 columns of 256; continued after it, its reply is the one a fresh prefill of the whole
    conversation gives (HFGenerator's, same stream), from its cache."""
    pad = tiny_tokenizer.pad_token_id
    slots = SlotGenerator(model, pad, [STOP], 1.0, slots=3, max_len=256)
    long = [20 + i % 50 for i in range(150)]
    [first] = slots.generate([long], 8, streams=[1])
    assert slots._cache.width == 192  # 150 + 8 - 1 columns: the 192 bucket
    slots.generate([[30, 31], [40, 41, 42]], 8, streams=[2, 3])
    assert slots._cache.width == 64
    after = long + first.ids + [STOP, 61, 62]
    reused = slots.reused_columns
    [mine] = slots.generate([after], 8, streams=[1])
    assert slots.reused_columns - reused == len(long) + len(first.ids) - 1  # continued from its slot
    [theirs] = HFGenerator(model, pad, [STOP], 1.0, reuse_cache=False, threads=1).generate([after], 8, streams=[1])
    assert mine.ids == theirs.ids and mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


def test_the_batch_bucket_by_hand():
    from agentgym_rl.agent.slot_generator import batch_bucket

    assert [batch_bucket(rows, 128) for rows in (1, 2, 3, 5, 9, 13, 17, 25, 33, 100, 128)] == [
        1, 2, 4, 8, 12, 16, 24, 32, 48, 128, 128]
    assert batch_bucket(13, 14) == 14  # never past the slots


def test_a_call_decodes_its_batch_bucket_and_rows_moved_into_it_keep_their_caches(model, tiny_tokenizer):
    """Four episodes fill four slots; a call continuing two of them (slots 2 and 3) decodes 2 rows,
    the two swapped into slots 0 and 1, and a call continuing the other two swaps them back in:
    each continued from its cache (only its new tokens run), with HFGenerator's replies."""
    pad = tiny_tokenizer.pad_token_id
    slots = SlotGenerator(model, pad, [STOP], 1.0, slots=4, max_len=128)
    hf = HFGenerator(model, pad, [STOP], 1.0, reuse_cache=False, threads=1)
    decoded_rows = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: decoded_rows.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[1] == 1 else None, with_kwargs=True)
    try:
        first = [[20, 21, 22], [30, 31], [40, 41, 42, 43], [50]]
        replies = slots.generate(first, 6, streams=[1, 2, 3, 4])
        assert set(decoded_rows) == {4}
        turns = [p + g.ids + [STOP, 60 + i] for i, (p, g) in enumerate(zip(first, replies))]
        for episodes in ([2, 3], [0, 1]):
            decoded_rows.clear()
            reused = slots.reused_columns
            prompts, streams = [turns[e] for e in episodes], [e + 1 for e in episodes]
            got = slots.generate(prompts, 6, streams=streams)
            assert set(decoded_rows) == {2}  # the batch bucket of 2 prompts, not the 4 slots
            # each continued from its slot: all it held but the reply's last id (never fed)
            assert slots.reused_columns - reused == sum(len(first[e]) + len(replies[e].ids) - 1 for e in episodes)
            assert _replies(got) == _replies(hf.generate(prompts, 6, streams=streams))
    finally:
        hook.remove()


def test_rows_still_replying_move_into_a_smaller_batch_and_keep_what_they_sampled(model, tiny_tokenizer):
    """Five sampled replies that stop at different steps, in 8 slots: as rows stop, those still
    replying are moved into the leading 4, then 2, then 1 slots and only those decode. Every reply
    and logprob is HFGenerator's, and the next turn continues each episode from its own cache."""
    pad = tiny_tokenizer.pad_token_id
    prompts, streams = [[20, 21, 22], [30, 31], [40, 41, 42, 43], [50], [60, 61]], [1, 2, 3, 4, 5]
    free = SlotGenerator(model, pad, [], 1.0, slots=8, max_len=128).generate(prompts, 12, streams=streams)
    stops = sorted({g.ids[1] for g in free[:3]})  # tokens these rows sample early: rows stop at different steps
    slots = SlotGenerator(model, pad, stops, 1.0, slots=8, max_len=128)
    hf = HFGenerator(model, pad, stops, 1.0, reuse_cache=True, threads=1)
    decoded_rows = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: decoded_rows.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[1] == 1 else None, with_kwargs=True)
    try:
        for turn in range(2):
            decoded_rows.clear()
            got = slots.generate(prompts, 12, streams=streams)
            decoded = list(decoded_rows)
            expected = hf.generate(prompts, 12, streams=streams)
            assert _replies(got) == _replies(expected)
            for mine, theirs in zip(got, expected):
                assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
            if turn == 0:
                lengths = sorted(len(g.ids) for g in got)
                assert lengths[0] < lengths[-2] < lengths[-1] == 12  # some stop early, one runs to the limit
                assert decoded[0] == 8 and decoded[-1] == 1 and decoded == sorted(decoded)[::-1]
                held = sum(len(p) + len(g.ids) - 1 for p, g in zip(prompts, got))
            prompts = [p + g.ids + [STOP, 70 + i] for i, (p, g) in enumerate(zip(prompts, got))]
    finally:
        hook.remove()
    assert slots.compactions >= 2
    assert slots.reused_columns == held  # each episode's second turn continued its own slot


def test_a_step_captured_mid_call_for_a_smaller_batch_keeps_the_rows_sampled_so_far(model, tiny_tokenizer,
                                                                                   monkeypatch):
    """With the stand-in for torch.cuda: a compacted batch's step is captured in the middle of a
    call (its warm-up runs every row idle), and the rows' tokens so far survive it: the replies
    are the eager generator's, and a graph was captured for each batch the call shrank to."""
    pad = tiny_tokenizer.pad_token_id
    prompts, streams = [[20, 21, 22], [30, 31], [40, 41, 42, 43], [50], [60, 61]], [1, 2, 3, 4, 5]
    free = SlotGenerator(model, pad, [], 1.0, slots=8, max_len=128).generate(prompts, 12, streams=streams)
    stops = sorted({g.ids[1] for g in free[:3]})
    eager = SlotGenerator(model, pad, stops, 1.0, slots=8, max_len=128)
    graphed = SlotGenerator(model, pad, stops, 1.0, slots=8, max_len=128, cuda_graphs=True)
    fake = _FakeCuda(graphed)
    monkeypatch.setattr(graphed, "_wants_graphs", lambda device: True)
    fake.install(monkeypatch)
    expected = eager.generate(prompts, 12, streams=streams)
    got = graphed.generate(prompts, 12, streams=streams)
    assert _replies(got) == _replies(expected)
    for mine, theirs in zip(got, expected):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-6)
    assert graphed.compactions >= 2 and fake.replays > 0
    assert sorted(batch for _, batch in graphed._graphs)[:2] == [1, 2] and max(b for _, b in graphed._graphs) == 8


def test_a_row_refilled_with_its_next_turn_mid_call_samples_what_turn_by_turn_calls_do(model, tiny_tokenizer):
    """Five sampled episodes of 1 to 3 turns whose replies stop at different steps, played in one
    call that refills each row as its reply ends: with its episode's next turn (the reply, then
    new tokens), and for the last row, after its first turn, an unrelated prompt on another
    stream (a waiting episode taking the slot). Every reply and logprob is HFGenerator's played
    turn by turn, each next turn continues its slot's cache, and rows start turns while others are
    mid-reply: fewer decoding steps than turn-by-turn calls."""
    pad = tiny_tokenizer.pad_token_id
    first, streams = [[20, 21, 22], [30, 31], [40, 41, 42, 43], [50], [60, 61]], [1, 2, 3, 4, 5]
    turns = [3, 2, 3, 1, 2]
    free = SlotGenerator(model, pad, [], 1.0, slots=8, max_len=256).generate(first, 12, streams=streams)
    stops = sorted({g.ids[1] for g in free[:3]})

    def next_prompt(i, turn, prompt, reply):
        if i == 4:
            return [90, 91, 92], 99
        return prompt + reply.ids + [STOP, 70 + 10 * turn + i], streams[i]

    # Turn by turn, each call waiting for its slowest reply.
    hf = HFGenerator(model, pad, stops, 1.0, reuse_cache=True, threads=1)
    expected, calls = [[] for _ in first], []
    playing = {i: (prompt, stream) for i, (prompt, stream) in enumerate(zip(first, streams))}
    while playing:
        order = sorted(playing)
        calls.append(([playing[i][0] for i in order], [playing[i][1] for i in order]))
        for i, prompt, reply in zip(order, calls[-1][0], hf.generate(calls[-1][0], 12, streams=calls[-1][1])):
            expected[i].append(reply)
            del playing[i]
            if len(expected[i]) < turns[i]:
                playing[i] = next_prompt(i, len(calls) - 1, prompt, reply)
    lockstep = SlotGenerator(model, pad, stops, 1.0, slots=8, max_len=256)
    decoded_rows = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: decoded_rows.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[1] == 1 else None, with_kwargs=True)
    try:
        for prompts, stream_of in calls:
            lockstep.generate(prompts, 12, streams=stream_of)
        lockstep_steps = len(decoded_rows)
        decoded_rows.clear()

        got = [[] for _ in first]
        prompts_now = list(first)

        def refill(i, reply):
            got[i].append(reply)
            if len(got[i]) == turns[i]:
                return None
            prompt, stream = next_prompt(i, len(got[i]) - 1, prompts_now[i], reply)
            prompts_now[i] = prompt
            return prompt, stream

        slots = SlotGenerator(model, pad, stops, 1.0, slots=8, max_len=256)
        last = slots.generate(first, 12, streams=streams, refill=lambda ended: [refill(i, g) for i, g in ended])
        refilled_steps = len(decoded_rows)
    finally:
        hook.remove()
    assert [len(g) for g in got] == turns and [g[-1] for g in got] == last
    for mine, theirs in zip(got, expected):
        assert _replies(mine) == _replies(theirs)
        for a, b in zip(mine, theirs):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({len(g.ids) for g in got[0]}) > 1 or len({len(g[0].ids) for g in got}) > 1  # replies of spread lengths
    # Next turns continued their slots: all but the unrelated prompt reused the cached conversation.
    assert slots.reused_columns == lockstep.reused_columns > 0
    assert refilled_steps < lockstep_steps  # 25 against 33 when written


def test_a_refilled_call_captures_a_wider_bucket_mid_call_and_keeps_the_eager_replies(model, tiny_tokenizer,
                                                                                     monkeypatch):
    """With the stand-in for torch.cuda: next turns 50 tokens longer than the first need a wider
    context bucket in the middle of a refilling call; its step is captured there, and the replies
    are the eager generator's."""
    pad = tiny_tokenizer.pad_token_id
    first, streams = [[20, 21, 22], [30, 31], [40, 41, 42, 43]], [1, 2, 3]

    def refill_into(got):
        def refill(i, reply):
            got[i].append(reply)
            if len(got[i]) == 2:
                return None
            return first[i] + reply.ids + [STOP] + [62] * 50, streams[i]
        return lambda ended: [refill(i, reply) for i, reply in ended]

    eager = SlotGenerator(model, pad, [STOP], 1.0, slots=4, max_len=160)
    graphed = SlotGenerator(model, pad, [STOP], 1.0, slots=4, max_len=160, cuda_graphs=True)
    fake = _FakeCuda(graphed)
    monkeypatch.setattr(graphed, "_wants_graphs", lambda device: True)
    fake.install(monkeypatch)
    expected, got = [[], [], []], [[], [], []]
    eager.generate(first, 8, streams=streams, refill=refill_into(expected))
    graphed.generate(first, 8, streams=streams, refill=refill_into(got))
    for mine, theirs in zip(got, expected):
        assert _replies(mine) == _replies(theirs) and len(mine) == 2
        for a, b in zip(mine, theirs):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    assert {width for width, _ in graphed._graphs} == {64, 96} and fake.replays > 0


def test_an_engine_run_that_refills_rows_plays_the_lockstep_run(model, tiny_tokenizer):
    """The rollout engine over the slot generator, 3 counter tasks x 2 samples with 4 rows:
    `rollout.continuous_turns` plays the run in one generator call, each episode's next turn
    (and, as episodes end, the two waiting ones) taking its row as its reply ends, and gives the
    same trajectories as lock-step turns: each episode samples from its own stream. A waiting
    episode's row takes the start of its prompt (the instruction, the same task's observation)
    from another slot: fewer prompt tokens run than in lock-step, where each group is prefilled."""
    from conftest import CounterEnv

    from agentgym_rl.agent.chat import ChatEncoder
    from agentgym_rl.config import RolloutConfig
    from agentgym_rl.envs.tasks import Task
    from agentgym_rl.rollout.engine import RolloutEngine
    from agentgym_rl.rollout.policy import ModelPolicy

    pad, encoder = tiny_tokenizer.pad_token_id, ChatEncoder(tiny_tokenizer)
    tasks = [Task("counter", i, f"goal{1 + i % 3}") for i in range(3)]

    def run(continuous: bool, stops: list[int]):
        generator = SlotGenerator(model, pad, stops, 1.0, slots=4, max_len=1024)
        calls = []
        generate = generator.generate
        generator.generate = lambda *args, **kwargs: calls.append(kwargs.get("refill")) or generate(*args, **kwargs)
        engine = RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=8, max_context=1024, max_envs=4,
                                                         continuous_turns=continuous))
        trajectories = engine.run(tasks, ModelPolicy(generator, encoder), max_turns=3, samples=2, sampling_seed=5)
        return trajectories, calls, generator.prefilled_columns

    free, _, _ = run(False, [encoder.end_of_turn_id])
    replies = [t.input_ids[i] for t in free for i in range(1, len(t.loss_mask)) if t.loss_mask[i] and t.loss_mask[i - 1]]
    stops = [encoder.end_of_turn_id, *sorted(set(replies[:3]))]  # tokens replies sample early: they stop at spread steps
    lockstep, lockstep_calls, lockstep_prefilled = run(False, stops)
    continuous, continuous_calls, continuous_prefilled = run(True, stops)
    assert len(continuous_calls) == 1 and continuous_calls[0] is not None and len(lockstep_calls) >= 3
    assert len(continuous) == len(lockstep) == 6
    for mine, theirs in zip(continuous, lockstep):
        assert (mine.item_id, mine.messages, mine.input_ids, mine.loss_mask, mine.turn_rewards) == (
            theirs.item_id, theirs.messages, theirs.input_ids, theirs.loss_mask, theirs.turn_rewards)
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
    assert len({sum(t.loss_mask) for t in lockstep}) > 1  # episodes of different lengths
    assert continuous_prefilled < lockstep_prefilled


@pytest.mark.parametrize("windows", [True, False])
def test_runs_that_cut_windows_or_load_weights_between_turns_play_lockstep_turns(model, tiny_tokenizer, windows):
    """Context windows are cut, and partial rollouts load newer weights, between rounds of turns:
    with either, a run over the slot generator plays turn by turn (each call without `refill`)
    although `continuous_turns` is on."""
    from conftest import CounterEnv

    from agentgym_rl.agent.chat import ChatEncoder
    from agentgym_rl.config import RolloutConfig
    from agentgym_rl.envs.tasks import Task
    from agentgym_rl.rollout.engine import RolloutEngine
    from agentgym_rl.rollout.policy import ModelPolicy

    encoder = ChatEncoder(tiny_tokenizer)
    generator = SlotGenerator(model, tiny_tokenizer.pad_token_id, [encoder.end_of_turn_id], 1.0, slots=4, max_len=1024)
    refills = []
    generate = generator.generate
    generator.generate = lambda *args, **kwargs: refills.append(kwargs.get("refill")) or generate(*args, **kwargs)
    engine = RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=4, max_context=1024, max_envs=4,
                                                     keep_turns=1 if windows else 0))
    trajectories = engine.run([Task("counter", 0, "goal1")], ModelPolicy(generator, encoder), max_turns=2, samples=2,
                              sampling_seed=5, between_turns=None if windows else lambda: 0)
    assert len(trajectories) == 2 and len(refills) >= 2 and set(refills) == {None}


def test_a_refilling_call_reads_the_context_its_live_rows_need(model, tiny_tokenizer):
    """The context bucket follows the rows still playing: it widens for a turn 70 tokens longer
    and narrows again once that episode is done, while another plays on with short turns."""
    pad = tiny_tokenizer.pad_token_id
    first, turns, widths = [[20, 21, 22], [30, 31]], [2, 6], []
    slots = SlotGenerator(model, pad, [STOP], 1.0, slots=2, max_len=256)

    def refill(i, reply, played={0: 0, 1: 0}):
        played[i] += 1
        if played[i] == turns[i]:
            return None
        extra = [62] * 70 if i == 0 else [63]
        return first[i] + reply.ids + [STOP] + extra, i + 1

    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(slots._cache.width) if kwargs["input_ids"].shape[1] == 1 else None,
        with_kwargs=True)
    try:
        slots.generate(first, 4, streams=[1, 2], refill=lambda ended: [refill(i, g) for i, g in ended])
    finally:
        hook.remove()
    assert widths[0] == 64 and 96 in widths and widths[-1] == 64


def test_the_slot_generator_attends_with_grouped_heads_uncopied(tiny_tokenizer):
    from agentgym_rl.agent.attention import NAME

    fresh = build_model(tiny_tokenizer, SHAPE, seed=0)
    SlotGenerator(fresh, tiny_tokenizer.pad_token_id, [STOP], slots=1)
    assert fresh.config._attn_implementation == NAME
