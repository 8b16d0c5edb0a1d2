"""Rollouts played ahead of the learner, in a thread, with a bound on how stale they may be
(`train.asynchronous`, `rollout.max_staleness`).

Versions count the learner's updates: the weights after step t's update are version t + 1, and
a synchronous run samples step s with version s. Here step s may be played as soon as version
s - k is out, so while the learner updates on step s the generator already plays s + 1 .. s + k
with the newest weights it has; the data of step s is then at most k versions old. The
generator holds its own copy of the weights (`Learner.detach_rollout_model`), loaded between
its steps, so an update never changes a model mid-episode; with `partial` (partial rollouts) also
between two turns of a step, each turn recording the version that wrote it. With k = 0 the
generator waits for every update, which is the synchronous run, one step after another.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..rollout.trajectory import Trajectory
from .. import metric_names as metric


@dataclass
class PlayedStep:
    """One step's episodes as the generator played them.

    Attributes:
        step: the 0-based training step they are for.
        trajectories, metrics: what `RLTrainer._play_step` returns.
        version: the policy version (updates applied) whose weights the step started with (every
            token's, unless partial rollouts loaded newer ones between turns: `turn_versions`).
        rollout_s: seconds the playing took.
    """

    step: int
    trajectories: list[Trajectory]
    metrics: dict[str, float]
    version: int
    rollout_s: float
    waited_s: float = field(default=0.0)
    """Seconds the learner waited for this step once it wanted it (set by `RolloutsAhead.take`)."""


class RolloutsNow:
    """Each step played when the learner takes it, with the weights of the update before: the
    synchronous run, behind the interface of `RolloutsAhead` so that the trainer has one loop.

    Args:
        play: plays one step: step -> (trajectories, metrics).
    """

    stalenesses: tuple[int, ...] = ()
    """None: every step's data is the newest weights'."""

    def __init__(self, play: Callable[[int], tuple[list[Trajectory], dict[str, float]]]):
        self._play = play

    def take(self, step: int) -> PlayedStep:
        began = time.time()
        trajectories, metrics = self._play(step)
        for trajectory in trajectories:
            trajectory.policy_version = step
        return PlayedStep(step, trajectories, metrics, step, time.time() - began)

    def extra_metrics(self, played: PlayedStep) -> dict[str, float]:
        return {}

    def step_done(self, version: int) -> None:
        """Nothing to hand over: the trainer syncs the generator after each update."""

    def close(self) -> None:
        pass


class RolloutsAhead:
    """Plays steps `first`, `first` + 1, ... `last` - 1 in a background thread, step s as soon
    as version s - `max_staleness` of the weights has been published, and hands them to the
    learner in order.

    Args:
        play: plays one step: step -> (trajectories, metrics), or with `partial`
            (step, between_turns) -> ...; runs in the thread.
        load: puts published weights into the generator (between steps, in the thread; with
            `partial`, between turns as well, through `load_newer`).
        first, last: the steps to play; the generator starts with version `first`.
        max_staleness: k, how many versions older than its step a step's data may be.
        threads: torch's CPU thread count in the thread (a new thread does not inherit the
            caller's setting).
        snapshot: the learner's weights, copied, for `step_done` to publish.
        partial: partial rollouts: `play` gets `load_newer` to call between turns.
    Attributes:
        stalenesses: how many versions old each step taken so far was.
    """

    def __init__(self, play: Callable[[int], tuple[list[Trajectory], dict[str, float]]],
                 load: Callable[[Any], None], first: int, last: int, max_staleness: int, threads: int,
                 snapshot: Callable[[], Any] | None = None, partial: bool = False):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self._play, self._load, self._snapshot = play, load, snapshot
        self.stalenesses: list[int] = []
        self._first, self._last, self.max_staleness, self._threads = first, last, max_staleness, threads
        self._cond = threading.Condition()
        self._version, self._weights = first, None  # the newest published, and its weights if not yet loaded
        self._loaded = first  # the version the generator holds
        self._partial = partial
        self._ready: dict[int, PlayedStep] = {}
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="rollouts-ahead", daemon=True)
        self._thread.start()

    def publish(self, version: int, weights: Any) -> None:
        """Weights of `version` (the learner's, copied: the learner goes on changing its own),
        for the generator to load before its next step; a newer publication replaces one not
        yet loaded."""
        with self._cond:
            self._version, self._weights = version, weights
            self._cond.notify_all()

    def take(self, step: int) -> PlayedStep:
        """Step `step`'s episodes, waiting for them; raises what the generator raised instead
        of playing them."""
        began = time.perf_counter()
        with self._cond:
            while step not in self._ready and self._error is None:
                self._cond.wait()
            if step not in self._ready:  # the steps played before the failure are still handed over
                raise self._error
            played = self._ready.pop(step)
        played.waited_s = time.perf_counter() - began
        self.stalenesses.append(step - played.version)
        return played

    def extra_metrics(self, played: PlayedStep) -> dict[str, float]:
        """What a step played ahead adds to its metrics: how stale it was (per turn too, with
        partial rollouts), and the learner's wait."""
        extra = {metric.ASYNC_STALENESS: played.step - played.version, metric.TIME_WAIT_S: played.waited_s}
        turns = [played.step - version for t in played.trajectories for version in t.turn_versions]
        if turns:
            extra.update({metric.ASYNC_TURN_STALENESS_MEAN: sum(turns) / len(turns),
                          metric.ASYNC_TURN_STALENESS_MAX: max(turns)})
        return extra

    def load_newer(self) -> int:
        """Between two turns of a step (partial rollouts, in the playing thread): load the newest
        published weights if the generator does not hold them yet; returns the version it holds."""
        with self._cond:
            version, weights, self._weights = self._version, self._weights, None
        if weights is not None:
            self._load(weights)
            self._loaded = version
        return self._loaded

    def step_done(self, version: int) -> None:
        """The learner finished the update that makes `version`: publish a copy of its weights
        (`snapshot`), last in the step, so that with max_staleness 0 nothing overlaps it."""
        self.publish(version, self._snapshot())

    def close(self) -> None:
        """Stop after the step being played (if any) and wait for the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        import torch

        torch.set_num_threads(self._threads)
        try:
            for step in range(self._first, self._last):
                with self._cond:
                    while self._version < step - self.max_staleness and not self._closing:
                        self._cond.wait()
                    if self._closing:
                        return
                    version, weights, self._weights = self._version, self._weights, None
                if weights is not None:
                    self._load(weights)
                    self._loaded = version
                began = time.perf_counter()
                trajectories, metrics = self._play(step, self.load_newer) if self._partial else self._play(step)
                for trajectory in trajectories:
                    trajectory.policy_version = version
                played = PlayedStep(step, trajectories, metrics, version, time.perf_counter() - began)
                with self._cond:
                    self._ready[step] = played
                    self._cond.notify_all()
        except BaseException as error:  # noqa: BLE001 — the learner re-raises it from `take`
            with self._cond:
                self._error = error
                self._cond.notify_all()


def staleness_histogram(stalenesses: list[int]) -> dict[int, int]:
    """How many steps were trained on data k versions old, for each k seen (ascending)."""
    return dict(sorted(Counter(stalenesses).items()))
