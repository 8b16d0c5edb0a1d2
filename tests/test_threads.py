"""Choosing the thread count of generation by timing decoding steps (`agent.threads`): the
schedule of counts by hand on a fake clock, and the generator running its forward passes on
the count the timings favour."""

from __future__ import annotations

import pytest
import torch

from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.threads import ThreadChooser, shared_chooser
from agentgym_rl.agent.tiny import TinyModelConfig, build_model


class FakeMachine:
    """A clock whose every reading advances by the cost of a pass on the thread count in force,
    and the thread count the chooser sets. A pass runs between two readings (`_CallTimer`
    reads the clock after setting a count and when the pass is done)."""

    def __init__(self, seconds_per_pass: dict[int, float]):
        self.seconds_per_pass = seconds_per_pass
        self.threads = 0
        self.set_log: list[int] = []
        self.now = 0.0

    def clock(self) -> float:
        self.now += self.seconds_per_pass.get(self.threads, 0.0)
        return self.now

    def set_threads(self, count: int) -> None:
        self.threads = count
        self.set_log.append(count)

    def chooser(self, **kwargs) -> ThreadChooser:
        return ThreadChooser((2, 1), clock=self.clock, set_threads=self.set_threads, **kwargs)


def play_call(chooser: ThreadChooser, machine: FakeMachine, passes: int) -> list[int]:
    """One generation call of `passes` forward passes; the count each pass ran on."""
    machine.set_log.clear()
    timer = chooser.call()
    for _ in range(passes):
        timer.pass_done()
    timer.finish()
    return machine.set_log[:passes]


def test_a_busy_machine_switches_to_one_thread_after_the_trial():
    machine = FakeMachine({2: 0.010, 1: 0.004})  # two threads 2.5x slower per pass
    chooser = machine.chooser()
    # pass 0 (the prompt) on the current count, passes 1-4 alternate 2, 1, 2, 1, the rest on the winner
    assert play_call(chooser, machine, 8) == [2, 2, 1, 2, 1, 1, 1, 1]
    assert chooser.current == 1 and chooser.last_trial == pytest.approx({2: 0.010, 1: 0.004})
    # the count changed, so the next trial comes after first_interval (4) calls: calls 1-3 exploit
    for _ in range(3):
        assert play_call(chooser, machine, 6) == [1] * 6
    assert play_call(chooser, machine, 6) == [1, 2, 1, 2, 1, 1]


def test_a_quiet_machine_keeps_its_threads_and_tries_less_often():
    machine = FakeMachine({2: 0.004, 1: 0.007})
    chooser = machine.chooser()
    calls_with_a_trial = []
    for call in range(40):
        ran = play_call(chooser, machine, 6)
        if 1 in ran:
            calls_with_a_trial.append(call)
    assert chooser.current == 2
    assert calls_with_a_trial == [0, 8, 24]  # each trial kept the count: the interval 4 doubled to 8, then 16


def test_a_machine_that_gets_busy_between_trials_is_tried_again_at_once():
    machine = FakeMachine({2: 0.004, 1: 0.007})
    chooser = machine.chooser()
    assert play_call(chooser, machine, 6) == [2, 2, 1, 2, 1, 2]  # the trial keeps 2 threads
    assert play_call(chooser, machine, 6) == [2] * 6  # next trial 8 calls away
    machine.seconds_per_pass = {2: 0.020, 1: 0.007}  # load arrives: 5x the trial's 2-thread steps
    assert play_call(chooser, machine, 6) == [2] * 6  # timed, found far off
    assert play_call(chooser, machine, 8) == [2, 2, 1, 2, 1, 1, 1, 1]  # tried at once, and switched
    assert chooser.current == 1


def test_step_times_near_the_last_trial_bring_no_trial_forward():
    machine = FakeMachine({2: 0.004, 1: 0.007})
    chooser = machine.chooser()
    play_call(chooser, machine, 6)
    machine.seconds_per_pass = {2: 0.007, 1: 0.007}  # 1.75x slower: inside the drift factor of 2
    runs = [play_call(chooser, machine, 6) for _ in range(7)]
    assert all(ran == [2] * 6 for ran in runs) and chooser.trials == 1


def test_a_small_difference_does_not_switch():
    machine = FakeMachine({2: 0.0100, 1: 0.0095})  # 5% faster: inside the 10% margin
    chooser = machine.chooser()
    play_call(chooser, machine, 8)
    assert chooser.current == 2 and chooser.trials == 1


def test_a_call_too_short_to_time_both_counts_tries_again_next_call():
    machine = FakeMachine({2: 0.010, 1: 0.004})
    chooser = machine.chooser()
    assert play_call(chooser, machine, 2) == [2, 2]  # the prompt, then one pass on 2 threads only
    assert chooser.trials == 0 and chooser.current == 2
    assert play_call(chooser, machine, 8) == [2, 2, 1, 2, 1, 1, 1, 1]
    assert chooser.trials == 1 and chooser.current == 1


def test_bad_candidates_are_refused():
    for candidates in [(), (2, 2), (0, 1)]:
        with pytest.raises(ValueError):
            ThreadChooser(candidates)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _threads_per_forward(generator: HFGenerator, prompts: list[list[int]], max_new: int) -> tuple[list[int], list]:
    seen: list[int] = []
    hook = generator.model.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    try:
        generations = generator.generate(prompts, max_new)
    finally:
        hook.remove()
    return seen, generations


def test_the_generator_decodes_on_the_count_its_timings_favour(tiny_tokenizer, two_threads):
    """A fake clock on which one thread is faster: after the trial's passes the model runs on one
    thread; the ids are those of a generator pinned to two threads; the count is restored."""
    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                                                        intermediate_size=64, max_positions=256)).eval()
    prompts = [tiny_tokenizer.encode("Your goal: go to the red ball."), tiny_tokenizer.encode("Thought: I")]
    pinned = HFGenerator(model, tiny_tokenizer.pad_token_id, [], temperature=0.0, threads=2)
    pinned_threads, expected = _threads_per_forward(pinned, prompts, 10)
    assert pinned_threads == [2] * 10

    chosen = HFGenerator(model, tiny_tokenizer.pad_token_id, [], temperature=0.0)
    chosen._chooser = ThreadChooser((2, 1), clock=_clock_on_torch_threads({2: 0.010, 1: 0.004}))
    threads, generations = _threads_per_forward(chosen, prompts, 10)
    assert threads == [2, 2, 1, 2, 1, 1, 1, 1, 1, 1]
    assert chosen.thread_passes == {2: 3, 1: 7} and pinned.thread_passes == {}
    assert [g.ids for g in generations] == [g.ids for g in expected]
    assert torch.get_num_threads() == 2


def test_a_pinned_or_single_thread_generator_does_not_time(tiny_tokenizer, two_threads):
    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                                                        intermediate_size=64, max_positions=256)).eval()
    prompt = [tiny_tokenizer.encode("Your goal")]
    pinned = HFGenerator(model, tiny_tokenizer.pad_token_id, [], temperature=0.0, threads=1)
    assert _threads_per_forward(pinned, prompt, 4)[0] == [1] * 4 and pinned._chooser is None
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    chosen = HFGenerator(model, tiny_tokenizer.pad_token_id, [], temperature=0.0)
    assert _threads_per_forward(chosen, prompt, 4)[0] == [1] * 4 and chosen._chooser is None


def _clock_on_torch_threads(seconds_per_pass: dict[int, float]):
    """A fake clock as `FakeMachine`'s, on the thread count torch really has."""
    now = [0.0]

    def clock() -> float:
        now[0] += seconds_per_pass[torch.get_num_threads()]
        return now[0]
    return clock


def test_generators_of_one_process_share_what_their_chooser_learnt(tiny_tokenizer, two_threads):
    """A new generator starts on the count an earlier one's trial chose, and counts its own passes."""
    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                                                        intermediate_size=64, max_positions=256)).eval()
    prompt = [tiny_tokenizer.encode("Your goal")]
    first, second = (HFGenerator(model, tiny_tokenizer.pad_token_id, [], temperature=0.0) for _ in range(2))
    chooser = shared_chooser((2, 1))
    before = dict(vars(chooser))  # the process's chooser: leave it as other tests found it
    try:
        _threads_per_forward(first, prompt, 4)
        assert first._chooser is chooser and sum(first.thread_passes.values()) == 4
        chooser.current, chooser.next_trial = 1, 10**9  # as if a trial had chosen 1
        assert _threads_per_forward(second, prompt, 4)[0] == [1] * 4
        assert second._chooser is chooser and second.thread_passes == {1: 4}
    finally:
        vars(chooser).update(before)
