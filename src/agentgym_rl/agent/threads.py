"""How many CPU threads a generation call runs torch on, chosen by timing its decoding steps.

On a quiet 2-core machine a rollout of the tiny model runs 1.6x faster on 2 intra-op threads
than on 1; on a busy one the same 2 threads run it 2-4x slower than 1 (docs/BENCHMARKS.md):
every decoding step is a few small operations, each split across the threads and ended by a
barrier that waits for whichever thread the scheduler took away. Neither count is right
everywhere, so `ThreadChooser` measures: now and then a generation call alternates the
candidate counts over its first decoding steps, and the faster one (by median step time) runs
the rest of that call and the calls after it, until the next trial. Between trials every call
times its decoding steps too: when they drift far from what the last trial measured (the
machine's load changed), the next call holds a trial at once. What a chooser learns is a fact
about the machine, so the generators of one process share it (`shared_chooser`): a new one
(an evaluation's, say) does not start over on a count a trial has already ruled out, which on
a busy machine made its first prefill several times slower.

The thread count changes float rounding (logprobs differ by ~1e-6 between 1 and 2 threads), so
a run that must repeat bit for bit pins it (`rollout.threads`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import Counter
from typing import Any, Callable


class ThreadChooser:
    """Picks torch's intra-op thread count, pass by pass, for generation calls.

    Args:
        candidates: the thread counts to choose from (e.g. (2, 1)); the first is the starting
            choice.
        trial_steps: decoding steps of a trial, taken by the candidates in turn.
        first_interval, max_interval: calls from one trial to the next. A trial that keeps the
            current count doubles the interval up to `max_interval` (a trial spends steps on
            the slower count, many times slower on a busy machine); one that changes it
            starts over.
        margin: another count replaces the current one only when its median step time is below
            `margin` times the current one's (step times are noisy on a busy machine).
        drift: a call between trials whose median step time on the current count is over
            `drift` times, or under 1/`drift` of, that count's time in the last trial brings
            the next trial forward to the next call.
        clock: seconds as a float (a test's fake clock).
        set_threads: sets the thread count (a test's recorder); torch.set_num_threads by default.
    """

    def __init__(self, candidates: tuple[int, ...], trial_steps: int = 4, first_interval: int = 4,
                 max_interval: int = 64, margin: float = 0.9, drift: float = 2.0,
                 clock: Callable[[], float] = time.perf_counter, set_threads: Callable[[int], None] | None = None):
        if len(set(candidates)) != len(candidates) or not candidates or min(candidates) < 1:
            raise ValueError(f"candidates must be distinct thread counts >= 1, got {candidates}")
        self.candidates = tuple(candidates)
        self.trial_steps = trial_steps
        self.first_interval = first_interval
        self.max_interval = max_interval
        self.margin = margin
        self.drift = drift
        self.clock = clock
        self._set = set_threads or _torch_set_threads
        self.current = self.candidates[0]
        self.calls = 0
        self.trials = 0
        self.interval = first_interval
        self.next_trial = 0
        self.last_trial: dict[int, float] = {}
        """Median seconds per decoding step of each candidate in the last trial that timed all."""

    def call(self) -> _CallTimer:
        """Timing for one generation call: it sets the call's starting count; call its
        `pass_done()` after every forward pass (`StepTimer` does) and `finish()` at the end."""
        trial = self.calls >= self.next_trial and len(self.candidates) > 1
        self.calls += 1
        return _CallTimer(self, trial)

    def _decide(self, samples: dict[int, list[float]]) -> None:
        if any(not samples.get(c) for c in self.candidates):
            return  # the call ended before every candidate was timed: try again next call
        medians = {c: statistics.median(samples[c]) for c in self.candidates}
        self.trials += 1
        self.last_trial = medians
        fastest = min(medians, key=medians.get)
        if medians[fastest] < self.margin * medians[self.current]:
            self.current = fastest
            self.interval = self.first_interval
        else:
            self.interval = min(2 * self.interval, self.max_interval)
        self.next_trial = self.calls + self.interval - 1

    def _check_drift(self, count: int, step_times: list[float]) -> None:
        """A call between trials ran its decoding steps on `count`: a far-off median means the
        machine changed since the last trial, so the next call holds one."""
        reference = self.last_trial.get(count)
        if not step_times or reference is None:
            return
        median = statistics.median(step_times)
        if median > self.drift * reference or median * self.drift < reference:
            self.next_trial = self.calls


@functools.cache
def shared_chooser(candidates: tuple[int, ...]) -> ThreadChooser:
    """The process's chooser over `candidates`, made on first use (see the module docstring)."""
    return ThreadChooser(candidates)


class _CallTimer:
    """One call's schedule. Forward pass 0 reads the prompt; pass d >= 1 decodes token d. In a
    trial, passes 1..`trial_steps` run on the candidates in turn; every other pass runs on the
    chooser's current count. The decoding passes are timed (a trial's for its decision, a
    later call's for the drift check)."""

    def __init__(self, chooser: ThreadChooser, trial: bool):
        self.chooser = chooser
        self.trial = trial
        self.passes = 0
        """Forward passes finished (transformers calls a logits processor after each)."""
        self.samples: dict[int, list[float]] = {}
        """Seconds of each timed decoding step, by thread count."""
        self.ran: Counter[int] = Counter()
        """Forward passes of this call on each thread count."""
        self.running = chooser.current
        chooser._set(self.running)
        self.began = chooser.clock()

    def pass_done(self) -> None:
        """A forward pass ended: time it (decoding passes), then set the count of the next."""
        chooser = self.chooser
        now = chooser.clock()
        self.ran[self.running] += 1
        if self.passes >= 1 and (not self.trial or self.passes <= chooser.trial_steps):
            self.samples.setdefault(self.running, []).append(now - self.began)
        self.passes += 1
        if self.trial and self.passes == chooser.trial_steps + 1:
            chooser._decide(self.samples)
        if self.trial and self.passes <= chooser.trial_steps:
            self.running = chooser.candidates[(self.passes - 1) % len(chooser.candidates)]
        else:
            self.running = chooser.current
        chooser._set(self.running)
        self.began = chooser.clock()

    def finish(self) -> None:
        """The call returned: a trial cut short decides on what it timed; any other call checks
        its steps against the last trial."""
        if not self.trial:
            self.chooser._check_drift(self.chooser.current, self.samples.get(self.chooser.current, []))
        elif self.passes <= self.chooser.trial_steps:
            self.chooser._decide(self.samples)


class StepTimer:
    """A transformers logits processor that reports each forward pass to a `_CallTimer`,
    leaving the scores as they are."""

    def __init__(self, timer: _CallTimer):
        self.timer = timer

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.timer.pass_done()
        return scores


def _torch_set_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)
