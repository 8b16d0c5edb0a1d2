"""The multi-turn rollout engine.

Many episodes (tasks × samples) advance together, one turn at a time: all active episodes'
prompts go to the generator as one batch, then all environments step in a thread pool.
Token ids are built exactly as sampled (see `agent.chat`). An environment that raises ends
only its own episode, which is kept and marked with the error (ARCHITECTURE.md, decision 6).

Environments are reused (decision 7): one whose episode ended cleanly waits for the engine's
next episode, in this run or a later one, because starting one can cost far more than a reset
(a SciWorld environment: 1 s to start its JVM, 0.06 s to reset; docs/BENCHMARKS.md). So an
engine holds at most as many environments as it ever ran at once; `close()` (or leaving a
`with` block) closes them. One that raised is closed and never reused.
"""

from __future__ import annotations

import copy
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..agent.sampling import GREEDY_STREAM, episode_stream
from ..config import RolloutConfig
from ..envs import registry
from ..envs.base import TextEnv
from ..envs.parsing import action_token, action_verb, first_wrong_token, located_action, right_next_tokens
from ..envs.tasks import Task
from ..errors import UserError
from .journal import Journal
from .policy import Policy, Reply, as_policy
from .rewards import EpisodeReward
from .trajectory import Trajectory

_JOURNALED = ("task", "group", "record", "done", "ids", "reply_start", "reply_ids", "state_key", "branches",
              "attempt", "dropped", "sample", "stream", "reward_failed", "info", "turn_starts", "opening",
              "shown_from", "summary")
"""The `_Episode` fields a journal keeps (the environment goes as its snapshot); a journal of an
earlier version may lack the last ones, which then take their defaults."""


@dataclass
class _Episode:
    task: Task
    group: int
    env: TextEnv
    record: Trajectory
    done: bool = False
    ids: list[int] = field(default_factory=list)
    reply_start: int = 0
    """Where the last reply's ids start in `record.input_ids`."""
    reply_ids: list[int] = field(default_factory=list)
    state_key: str = ""
    """The environment's `info["state_key"]` of the state the next action is taken from."""
    branches: int = 0
    """`rollout.fork_at`: the samples still to branch from this episode at that turn."""
    attempt: int = 0
    """How many failed attempts of this sample came before this one (`rollout.episode_retries`)."""
    sample: int = 0
    """Which of its task's samples it is (0: the first; with forks, the trunk)."""
    stream: int | None = None
    """The random stream its sampling draws from (`agent.sampling`; None: the process' own)."""
    dropped: bool = False
    """A failed attempt that was played again: not returned."""
    info: dict[str, Any] = field(default_factory=dict)
    """The environment's last `info` (what `env.reward`'s function is given)."""
    version: int | None = None
    """The policy version writing its next reply (`RolloutEngine.run`'s `between_turns`)."""
    reward_failed: bool = False
    """`env.reward` failed on the finished episode: its environment is sound, and playing the
    episode again would ask the same function about the same kind of episode (not retried)."""
    turn_starts: list[int] = field(default_factory=list)
    """Where each turn its context window shows begins in `ids` (its reply, reply prefix first):
    where `rollout.keep_turns` cuts."""
    opening: int = 0
    """How many of `record.messages` every context window opens with (system prompt, worked
    example, the first observation)."""
    shown_from: int = 0
    """The first turn the policy is shown after the opening (`rollout.keep_turns`; 0: all)."""
    summary: str = ""
    """The policy's last summary of the turns it is no longer shown (`rollout.summarize`)."""
    awaiting_summary: list[int] | None = None
    """A cut is due and waits for the episode's summary: the new observation's ids (empty for
    a text policy), which open the next window after it."""


class RolloutEngine:
    """Runs episodes of tasks with a model or scripted policy.

    Args:
        make_env: builds a fresh environment (in-process, HTTP client, ... — any `TextEnv`).
        config: token limits, threads and prompt options.
    """

    def __init__(self, make_env: Callable[[], TextEnv], config: RolloutConfig | None = None,
                 reward: EpisodeReward | None = None):
        self.make_env = make_env
        self.config = config or RolloutConfig()
        self.reward = reward  # `env.reward`: a Python function's reward put on each finished episode
        self._idle: list[TextEnv] = []  # environments whose episode ended cleanly, ready for the next
        self._idle_lock = threading.Lock()
        self.envs_made = 0
        self.retried = 0  # failed attempts played again (`rollout.episode_retries`), over the engine's life
        self.journal_s = 0.0  # seconds spent writing journals, over the engine's life
        self.journal_bytes = 0  # the size of the last journal written
        self.resumed = 0  # unfinished episodes continued from a journal, over the engine's life
        self.reread = 0  # finished episodes read from a journal instead of played, over the engine's life
        self._prefix: list[int] = []  # rollout.reply_prefix's ids for the current run
        self._example: list[dict[str, Any]] = []  # rollout.example's messages, played once
        self._sampling_seed: int | None = None  # the current run's
        self._greedy_samples = 0  # the current run's

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the environments kept for reuse (the engine may still run: it makes new ones)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for env in idle:
            _close_quietly(env)

    def _take_env(self) -> TextEnv:
        with self._idle_lock:
            if self._idle:
                return self._idle.pop()
        env = self.make_env()
        with self._idle_lock:
            self.envs_made += 1
        return env

    def run(self, tasks: list[Task], policy: Policy | Any, max_turns: int, samples: int = 1, seed: int = 0,
            progress: Callable[[int], Any] | None = None, sampling_seed: int | None = None,
            journal: Journal | None = None, between_turns: Callable[[], int] | None = None,
            greedy_samples: int = 0, reread_progress: Callable[[int], Any] | None = None) -> list[Trajectory]:
        """Play each task `samples` times, at most `max_turns` environment steps each.

        Args:
            tasks: the tasks; task k's samples get `group` k.
            policy: a `Policy` (a model's, or a text policy), or an object with `act(env) -> str`
                (a scripted expert; see `as_policy`).
            max_turns: the interaction horizon.
            samples: episodes per task.
            seed: passed to every `reset`.
            progress: called with the number of episodes that just finished.
            sampling_seed: give every episode its own random stream, from this seed, its task's
                name and its sample's number (`agent.sampling.episode_stream`), so that
                what it samples does not depend on what it is batched with: a resumed or
                re-issued episode, or one played in another worker, samples alike. None: the
                policy samples from the process' random state.
            journal: write the run's episodes there every `journal.every` turns and at the
                end, and continue from what it holds when it is this run's (`rollout/journal.py`):
                finished episodes are kept, unfinished ones restored from their environment's
                snapshot and played on from their own random streams: a sampling policy needs
                `sampling_seed` with a journal.
            between_turns: called before each round of replies (partial rollouts: it may load
                newer weights into the policy, which drops their KV caches); returns the policy
                version that writes them, recorded per turn (`Trajectory.turn_versions`).
            greedy_samples: of each task's samples, how many (the first) decode greedily, the
                others sampled from their streams (`agent.sampling.GREEDY_STREAM`; needs
                `sampling_seed` and a generator that reads streams).
            reread_progress: called once with the number of finished episodes read back from the
                journal, before any is played (`progress.count_as_done` keeps them out of a
                bar's rate); None: they count through `progress` as if just played.
        Returns:
            trajectories ordered task by task, samples together.
        """
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        policy = as_policy(policy)
        if journal is not None and sampling_seed is None and (_temperature(policy) or 0) > 0:
            # From the process' random state a resumed episode would sample otherwise than the
            # uninterrupted one, and nothing would say so.
            raise ValueError("a journal needs sampling_seed for a sampling policy: resumed episodes "
                             "must continue their own random streams")
        if greedy_samples and sampling_seed is None:
            raise ValueError("greedy_samples marks episodes by their random stream: it needs sampling_seed")
        # Weights change between runs (a learner update), and the same first prompts recur (each
        # validation replays the same items), so a generator's kept KV cache must not outlive a
        # run. Within a run the weights are fixed, so the run boundary is the only reset needed.
        policy.reset()
        try:
            self._sampling_seed, self._greedy_samples = sampling_seed, greedy_samples
            return self._run(tasks, policy, max_turns, samples, seed, progress, journal, between_turns,
                             reread_progress or progress)
        finally:
            policy.reset()  # also frees the cache's memory between runs

    def _run(self, tasks: list[Task], policy: Policy, max_turns: int, samples: int, seed: int,
             progress: Callable[[int], Any] | None, journal: Journal | None,
             between_turns: Callable[[], int] | None,
             reread_progress: Callable[[int], Any] | None) -> list[Trajectory]:
        self._prefix = self._reply_prefix(policy)
        if self.config.example and not self._example:
            self._example = self._worked_example()
        fork = self.config.fork_at if samples > 1 else 0
        # With forks, one trunk per task; its other samples branch from it (or, if it ends
        # sooner, join the queue as episodes of their own).
        # A job: (task, group, attempt, sample).
        jobs = [(task, group, 0, sample) for group, task in enumerate(tasks) for sample in range(1 if fork else samples)]
        limit = self.config.max_envs or min(
            [cap for cap in (getattr(self.make_env, "max_parallel", 0), getattr(policy, "max_batch", 0),
                             self._cache_cap(policy)) if cap],
            default=len(jobs))
        episodes: list[_Episode] = []
        started = 0  # jobs started so far
        signature = self._signature(tasks, policy, max_turns, samples, seed, fork)
        if self.config.summarize and getattr(policy, "listed_actions_only", False):
            raise UserError("rollout.summarize asks for summaries, which replies restricted to the listed actions "
                            "cannot be; use one of them")
        if self._continuous(policy, fork, journal, between_turns):
            return _records(self._play_continuously(jobs, limit, policy, max_turns, seed, progress))
        saved = journal.load(signature) if journal is not None else None
        turns = 0
        with ThreadPoolExecutor(max_workers=self.config.env_workers) as pool:
            if saved is not None:
                episodes, jobs, started = self._resume(saved, pool), saved["jobs"], saved["started"]
                self._retry_failed([e for e in episodes if e.done], jobs)
                self._report([e for e in episodes if not e.dropped], reread_progress)
            while True:
                self._unbranched_samples(episodes, jobs)
                # Start episodes as others finish, so at most `limit` environments are alive.
                alive = sum(1 for e in episodes if not e.done)
                starting = jobs[started:started + max(limit - alive, 0)]
                if starting:
                    fresh = list(pool.map(lambda job: self._start(*job, policy=policy, seed=seed), starting))
                    if fork:
                        for index, episode in enumerate(fresh, start=started):
                            episode.branches = samples - 1 if index < len(tasks) else 0  # the trunks
                    started += len(starting)
                    episodes += fresh
                    self._retry_failed(fresh, jobs)
                    self._report([e for e in fresh if not e.dropped], progress)
                active = [e for e in episodes if not e.done]
                if not active:  # done, unless trunks that ended as they started have samples to come
                    if started == len(jobs) and not self._unbranched_samples(episodes, jobs):
                        break
                    continue
                if between_turns is not None:
                    version = between_turns()
                    for episode in active:
                        episode.version = version
                replies = self._act(active, policy)
                list(pool.map(lambda pair: self._step(*pair, policy, max_turns), zip(active, replies)))
                self._summarize([e for e in active if e.awaiting_summary is not None and not e.done], policy)
                self._retry_failed(active, jobs)
                self._report([e for e in active if not e.dropped], progress)
                # Trunks at the fork branch now; one that ended sooner leaves its samples to
                # `_unbranched_samples`, which plays them from the start.
                for episode in [e for e in active if e.branches and not e.done and e.record.turns == fork]:
                    branches = self._branch(episode)
                    self._retry_failed(branches, jobs)  # a branch whose restore failed starts afresh
                    episodes += branches
                    episode.branches = 0
                turns += 1
                if journal is not None and turns % journal.every == 0:
                    self._write(journal, signature, episodes, jobs, started, pool)
            if journal is not None:  # the whole run: played again (same key), it is read, not played
                self._write(journal, signature, episodes, jobs, started, pool)
        return _records(episodes)

    def _signature(self, tasks: list[Task], policy: Policy, max_turns: int, samples: int, seed: int,
                   fork: int) -> dict[str, Any]:
        """What a journal must have been written by to be continued: the run's tasks and every
        setting that changes what its episodes play."""
        signature = {"tasks": [task.item_id for task in tasks], "samples": samples, "seed": seed,
                     "sampling_seed": self._sampling_seed, "max_turns": max_turns, "fork_at": fork,
                     "reply_prefix": self.config.reply_prefix, "max_new_tokens": self.config.max_new_tokens,
                     "max_context": self.config.max_context, "system_prompt": self.config.system_prompt,
                     "locate_wrong_tokens": self.config.locate_wrong_tokens,
                     "temperature": _temperature(policy),
                     "example": [self.config.example, self.config.example_turns] if self.config.example else None}
        # The keys below only when set: a journal written before these settings existed still matches.
        if self._greedy_samples:
            signature["greedy_samples"] = self._greedy_samples
        if self.config.keep_turns:
            signature["context"] = [self.config.keep_turns, self.config.window_turns, self.config.summarize,
                                    self.config.summary_tokens, self.config.summary_prompt]
        if self.config.stop_strings:
            signature["stop_strings"] = list(self.config.stop_strings)
        return signature

    def _continuous(self, policy: Policy, fork: int, journal: Journal | None,
                    between_turns: Callable[[], int] | None) -> bool:
        """Whether the run plays in continuous turns (`rollout.continuous_turns`): forks,
        journals, context windows and partial rollouts work between rounds of lock-step turns."""
        return (self.config.continuous_turns and getattr(policy, "plays_turns_continuously", False) and not fork
                and journal is None and between_turns is None and not self.config.keep_turns)

    def _play_continuously(self, jobs: list[tuple[Task, int, int, int]], limit: int, policy: Policy, max_turns: int,
                           seed: int, progress: Callable[[int], Any] | None) -> list[_Episode]:
        with ThreadPoolExecutor(max_workers=self.config.env_workers) as pool:
            return self._play_in_pool(jobs, limit, policy, max_turns, seed, progress, pool)

    def _play_in_pool(self, jobs: list[tuple[Task, int, int, int]], limit: int, policy: Policy, max_turns: int,
                      seed: int, progress: Callable[[int], Any] | None, pool: ThreadPoolExecutor) -> list[_Episode]:
        """The run's episodes, `limit` at a time, in one call of the policy (`ModelPolicy.play`):
        when an episode's reply ends, its environment steps and its next turn takes its row at
        once, while the others are still in the middle of theirs; once it is done, the next
        waiting episode takes the row. Each episode plays as in lock-step turns (`_run`): its
        stream samples the same tokens whatever it is batched with."""
        episodes: list[_Episode] = []
        started = 0

        def admitted(fresh: list[_Episode]) -> list[_Episode]:
            """Those of `fresh` that can play; the others (a reset that failed, a first prompt
            past the context) are done at once: retried or reported."""
            episodes.extend(fresh)
            self._retry_failed(fresh, jobs)
            self._report([e for e in fresh if not e.dropped], progress)
            return [e for e in fresh if not e.done]

        def next_episode() -> _Episode | None:
            nonlocal started
            while started < len(jobs):
                started += 1
                playable = admitted([self._start(*jobs[started - 1], policy=policy, seed=seed)])
                if playable:
                    return playable[0]
            return None

        rows = admitted(list(pool.map(lambda job: self._start(*job, policy=policy, seed=seed), jobs[:limit])))
        started = min(limit, len(jobs))
        while len(rows) < limit and (episode := next_episode()) is not None:
            rows.append(episode)
        if not rows:
            return episodes

        def next_turns(ended: list[tuple[int, Reply]]) -> list[tuple[list[int], int | None] | None]:
            for row, reply in ended:
                self._take_reply(rows[row], reply, policy)
            # The environments step at once, as a lock-step turn's do.
            list(pool.map(lambda pair: self._step(rows[pair[0]], pair[1], policy, max_turns), ended))
            turns: list[tuple[list[int], int | None] | None] = []
            for row, _ in ended:
                episode = rows[row]
                if episode.done:
                    self._retry_failed([episode], jobs)
                    if not episode.dropped:
                        self._report([episode], progress)
                    episode = next_episode()
                    if episode is None:
                        turns.append(None)
                        continue
                    rows[row] = episode
                turns.append((episode.ids + self._prefix, episode.stream))
            return turns

        policy.play([e.ids + self._prefix for e in rows], self.config.max_new_tokens, next_turns,
                    streams=None if self._sampling_seed is None else [e.stream for e in rows])
        return episodes

    def _write(self, journal: Journal, signature: dict[str, Any], episodes: list[_Episode],
               jobs: list[tuple[Task, int, int, int]], started: int, pool: ThreadPoolExecutor) -> None:
        """The run as it stands into `journal`: unfinished episodes with their environment's
        snapshot (an environment that fails to take one ends its episode, as any failure)."""
        began = time.perf_counter()

        def snapshot(episode: _Episode) -> bytes | Exception:
            try:
                return episode.env.snapshot()
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 — failures are data
                return error

        live = [e for e in episodes if not e.done]
        try:
            states = dict(zip(map(id, live), pool.map(snapshot, live)))
        except NotImplementedError as error:
            raise UserError(f"rollout.journal_every keeps unfinished episodes as environment snapshots: {error}") \
                from None
        failed = [e for e in live if isinstance(states[id(e)], Exception)]
        for episode in failed:
            self._fail(episode, states.pop(id(episode)))
        self._retry_failed(failed, jobs)
        kept = [{**{name: getattr(e, name) for name in _JOURNALED}, "env_state": states.get(id(e))} for e in episodes]
        self.journal_bytes = journal.save(signature, {"episodes": kept, "jobs": jobs, "started": started})
        self.journal_s += time.perf_counter() - began

    def _resume(self, saved: dict[str, Any], pool: ThreadPoolExecutor) -> list[_Episode]:
        """The journal's episodes, the unfinished ones in environments restored from their snapshots."""
        episodes = []
        for kept in saved["episodes"]:
            fields = {name: kept[name] for name in _JOURNALED if name in kept}
            episodes.append((_Episode(env=None, **fields), kept["env_state"]))  # type: ignore[arg-type]

        def restore(pair: tuple[_Episode, bytes | None]) -> _Episode:
            episode, state = pair
            if not episode.done:
                try:
                    episode.env = self._take_env()
                    episode.env.restore(state)
                except Exception as error:  # noqa: BLE001 — failures are data
                    self._fail(episode, error)
            return episode

        restored = list(pool.map(restore, episodes))
        self.resumed += sum(1 for _, state in episodes if state is not None)
        self.reread += sum(1 for episode, _ in episodes if episode.done)
        return restored

    @staticmethod
    def _branch_jobs(trunk: _Episode) -> list[tuple[Task, int, int, int]]:
        """The samples `trunk` had still to branch, as jobs of their own (samples 1, 2, ...)."""
        return [(trunk.task, trunk.group, 0, sample) for sample in range(1, trunk.branches + 1)]

    def _unbranched_samples(self, episodes: list[_Episode], jobs: list[tuple[Task, int, int, int]]) -> int:
        """Queue as jobs of their own the samples of every trunk that ended before it could branch
        them and will not be played again: at its start (a reset that failed, a first prompt over
        the context limit), in a journal's restore or in a snapshot, as well as in a turn.
        Returns how many jobs it queued."""
        queued = 0
        for episode in episodes:
            if episode.done and episode.branches and not episode.dropped:
                new = self._branch_jobs(episode)
                jobs += new
                queued += len(new)
                episode.branches = 0
        return queued

    def _retry_failed(self, episodes: list[_Episode], jobs: list[tuple[Task, int, int, int]]) -> None:
        """Queue another attempt of each episode in `episodes` that just failed in its environment,
        while `rollout.episode_retries` allows; the failed attempt is dropped. The samples a failed
        trunk had still to branch are played from the start."""
        for episode in episodes:
            if (episode.done and not episode.dropped and episode.record.error is not None
                    and not episode.reward_failed and episode.attempt < self.config.episode_retries):
                episode.dropped = True
                self.retried += 1
                jobs.append((episode.task, episode.group, episode.attempt + 1, episode.sample))
                jobs += self._branch_jobs(episode)
                episode.branches = 0

    def _branch(self, trunk: _Episode) -> list[_Episode]:
        """`trunk.branches` copies of `trunk` at this turn, each in an environment restored from
        its snapshot, to be played on independently."""
        try:
            state = trunk.env.snapshot()
        except NotImplementedError as error:
            raise UserError(f"rollout.fork_at branches episodes from snapshots: {error}") from None
        branches = []
        for sample in range(1, trunk.branches + 1):
            record = copy.deepcopy(trunk.record)
            branch = _Episode(trunk.task, trunk.group, env=None, record=record,  # type: ignore[arg-type]
                              ids=list(trunk.ids), reply_start=trunk.reply_start,
                              reply_ids=list(trunk.reply_ids), state_key=trunk.state_key, sample=sample,
                              stream=self._stream(trunk.task, sample), turn_starts=list(trunk.turn_starts),
                              opening=trunk.opening, shown_from=trunk.shown_from, summary=trunk.summary)
            try:
                branch.env = self._take_env()
                branch.env.restore(state)
            except Exception as error:  # noqa: BLE001 — failures are data
                self._fail(branch, error)
            branches.append(branch)
        return branches

    def _cache_cap(self, policy: Policy) -> int:
        """Episodes whose KV caches fit `rollout.kv_cache_mb` at `max_context` tokens each (0: no cap)."""
        per_token = getattr(policy, "cache_bytes_per_token", 0)
        if not per_token:
            return 0
        return self.config.episodes_in_cache(per_token)

    def _stream(self, task: Task, sample: int) -> int | None:
        if self._sampling_seed is None:
            return None
        if sample < self._greedy_samples:
            return GREEDY_STREAM
        return episode_stream(self._sampling_seed, task.item_id, sample)

    def _start(self, task: Task, group: int, attempt: int, sample: int, *, policy: Policy, seed: int) -> _Episode:
        record = Trajectory(env_id=task.env_id, item_id=task.item_id, category=task.category, group=group)
        episode = _Episode(task, group, env=None, record=record, attempt=attempt,  # type: ignore[arg-type]
                           sample=sample, stream=self._stream(task, sample))
        try:
            episode.env = self._take_env()
            # By name ("babyai_12"), which every environment takes: a mix of environments plays it
            # in the member that name belongs to.
            observation, info = episode.env.reset(task.item_id, seed=seed)
        except Exception as error:  # noqa: BLE001 — failures are data
            return self._fail(episode, error)
        episode.state_key = str(info.get("state_key") or "")
        if self.config.system_prompt and episode.env.instruction:
            record.messages.append({"role": "system", "content": episode.env.instruction})
        record.messages += [dict(message) for message in self._example]
        record.messages.append({"role": "user", "content": observation})
        episode.opening = len(record.messages)
        if policy.encoder is not None:  # a token policy: the episode is kept as token ids too
            episode.ids = policy.encoder.start(record.messages)
            record.input_ids = list(episode.ids)
            record.loss_mask = [0] * len(episode.ids)
            record.logprobs = [0.0] * len(episode.ids)
            if len(episode.ids) + len(self._prefix) + self.config.max_new_tokens > self.config.max_context:
                record.truncated = True
                self._finish(episode)
        return episode

    def _worked_example(self) -> list[dict[str, Any]]:
        """`rollout.example`'s opening messages: for each example item in order, the expert's
        episode on it, observation and reply turn by turn, at most `example_turns` turns,
        without the observation after the last reply (the next example's, or the episode's own
        first observation, follows). Replies are marked `loss: False`, so that fine-tuning on
        these conversations never trains them."""
        items = [self.config.example] if isinstance(self.config.example, str) else self.config.example
        env = self._take_env()
        try:
            messages = [message for item in items for message in self._expert_turns(env, item)]
        except BaseException:
            _close_quietly(env)
            raise
        with self._idle_lock:
            self._idle.append(env)  # reset by the next episode that takes it
        return messages

    def _expert_turns(self, env: TextEnv, item: str) -> list[dict[str, Any]]:
        """The expert's first `example_turns` turns on training item `item`, played in `env`."""
        try:
            observation, info = env.reset(item)
        except Exception as error:  # noqa: BLE001 — a wrong item is the user's to fix
            raise UserError(f"rollout.example {item!r}: {error}") from None
        canonical = str(info.get("item_id", item))  # "<env>_<index>": a mix's member names itself
        if canonical in {task.item_id for task in _test_tasks(canonical.rsplit("_", 1)[0])}:
            raise UserError(f"rollout.example {item!r} is a test item: the evaluation would show the "
                            f"model the answer to one of its items; take one of the train split")
        messages: list[dict[str, Any]] = []
        for _ in range(self.config.example_turns):
            reply = env.expert_action()
            if reply is None:
                raise UserError(f"rollout.example needs an expert, and environment {env.env_id!r} has none")
            messages += [{"role": "user", "content": observation},
                         {"role": "assistant", "content": reply, "loss": False}]
            observation, _, terminated, truncated, _ = env.step(reply)
            if terminated or truncated:
                break
        return messages

    def _reply_prefix(self, policy: Policy) -> list[int]:
        """The ids of `rollout.reply_prefix` for a token policy (none for a text policy)."""
        prefix = self.config.reply_prefix
        if not prefix or policy.encoder is None:
            return []
        if getattr(policy, "listed_actions_only", False):
            raise UserError("rollout.reply_prefix and listed_actions_only both shape the replies; use one of them")
        return policy.encoder.encode_text(prefix)

    def _reply_decoder(self, policy: Policy) -> Callable[[Sequence[int]], str]:
        """Generated ids -> the reply's text as the environment read it: after the reply prefix,
        so that an action is found (and located token by token) in "Action: go to ..." even
        though "Action:" was context and only " go to ..." was generated."""
        if not self._prefix:
            return policy.encoder.decode_reply
        prefix = self.config.reply_prefix
        return lambda ids: prefix + policy.encoder.decode_reply(ids)

    def _act(self, active: list[_Episode], policy: Policy) -> list[Reply]:
        prefix = self._prefix
        streams = {} if self._sampling_seed is None else {"streams": [e.stream for e in active]}
        replies = policy.act([e.env for e in active], [e.ids + prefix for e in active], self.config.max_new_tokens,
                             conversations=[self._shown_messages(e) for e in active], **streams)
        if policy.encoder is not None:
            for episode, reply in zip(active, replies):
                self._take_reply(episode, reply, policy)
        return replies

    def _take_reply(self, episode: _Episode, reply: Reply, policy: Policy) -> None:
        """Append a token policy's `reply` (after the reply prefix) to `episode`'s ids and record."""
        prefix = self._prefix
        episode.turn_starts.append(len(episode.ids))
        if prefix:  # context the reply continues from, not trained: part of the reply's text
            self._extend(episode, prefix, [0] * len(prefix), [0.0] * len(prefix))
            reply.text = self.config.reply_prefix + reply.text
        ids, mask, logprobs = list(reply.ids), [1] * len(reply.ids), list(reply.logprobs)
        closing = _closing(reply, policy)  # the conversation stays well-formed; not trained on
        ids += closing
        mask += [0] * len(closing)
        logprobs += [0.0] * len(closing)
        episode.reply_start, episode.reply_ids = len(episode.record.input_ids), list(reply.ids)
        self._extend(episode, ids, mask, logprobs)

    def _step(self, episode: _Episode, reply: Reply, policy: Policy, max_turns: int) -> None:
        record = episode.record
        if reply.error is not None:  # the environment failed while the policy asked it
            record.error = reply.error
            self._finish(episode)
            return
        message = {"role": "assistant", "content": reply.text}
        record.messages.append(message if reply.trained else {**message, "loss": False})
        locate = self.config.locate_wrong_tokens and policy.encoder is not None
        try:
            actions = episode.env.available_actions() if locate else None
            observation, reward, terminated, truncated, info = episode.env.step(reply.text)
        except Exception as error:  # noqa: BLE001 — failures are data
            self._fail(episode, error)
            return
        observation = self._within_budget(observation, policy)
        record.messages.append({"role": "user", "content": observation})
        if info.get("invalid_action", False):
            record.invalid_turns.append(record.turns)
            record.invalid_actions += 1
            decode = self._reply_decoder(policy) if actions else None
            wrong = first_wrong_token(episode.reply_ids, decode, actions, reply.finished) if decode else None
            if wrong is not None:
                record.wrong_tokens.append(episode.reply_start + wrong)
                record.right_tokens.append(right_next_tokens(episode.reply_ids, wrong, decode,
                                                             policy.encoder.encode_text, actions))
        turn = record.turns
        episode.info = info
        if episode.version is not None:
            record.turn_versions.append(episode.version)
        record.turn_rewards.append(float(reward))
        record.state_keys.append(episode.state_key)
        episode.state_key = str(info.get("state_key") or "")
        accepted = not info.get("invalid_action", False)
        if episode.state_key and episode.state_key in record.state_keys and accepted:
            record.idle_turns.append(turn)
            decode = self._reply_decoder(policy) if locate else None
            start = action_token(episode.reply_ids, decode) if decode else None
            if start is not None:
                record.idle_tokens.append(episode.reply_start + start)
        elif accepted and locate:
            located = located_action(episode.reply_ids, self._reply_decoder(policy))
            if located is not None:
                record.action_tokens.append(episode.reply_start + located[1])
                record.action_verbs.append(str(info.get("action_kind") or action_verb(located[0])))
                if (info.get("discovered") or 0) > 0:
                    record.discovery_tokens.append(record.action_tokens[-1])
        record.success = record.success or bool(info.get("success", False))
        record.terminated = terminated
        record.truncated = truncated or (not terminated and record.turns >= max_turns)
        if terminated or record.truncated:
            self._finish(episode)
            return
        delta = policy.encoder.user_delta(record.messages[:-1], observation) if policy.encoder is not None else []
        if self._cut_due(episode):
            if self.config.summarize and getattr(policy, "writes_summaries", True):
                episode.awaiting_summary = delta  # the round's summaries are asked for together
            else:
                self._open_window(episode, delta, policy)
            return
        if policy.encoder is not None:
            if len(episode.ids) + len(delta) + len(self._prefix) + self.config.max_new_tokens > self.config.max_context:
                record.truncated = True
                self._finish(episode)
                return
            self._extend(episode, delta, [0] * len(delta), [0.0] * len(delta))

    def _cut_due(self, episode: _Episode) -> bool:
        """Whether `rollout.keep_turns` cuts the episode's context before its next reply: its
        window would show more than `window_turns` (or `keep_turns`) earlier turns."""
        keep = self.config.keep_turns
        return bool(keep) and episode.record.turns - episode.shown_from > (self.config.window_turns or keep)

    def _open_window(self, episode: _Episode, delta: list[int], policy: Policy, turns_end: int | None = None) -> None:
        """Cut the episode's context: from now on the policy is shown the opening and the last
        `keep_turns` turns. A token policy's episode gets a new context window: the opening
        encoded afresh (with its note), the kept turns' ids exactly as the model saw them, then
        `delta` (the new observation); truncated when that would not leave room for a reply.
        `turns_end`: where the last turn ends in the current window's ids (a summary follows it)."""
        record, keep = episode.record, self.config.keep_turns
        episode.shown_from = record.turns - keep
        if policy.encoder is None:
            return
        head = policy.encoder.start(self._opening(episode))
        kept_from = episode.turn_starts[-keep]
        window = head + episode.ids[kept_from:turns_end] + delta
        if len(window) + len(self._prefix) + self.config.max_new_tokens > self.config.max_context:
            record.truncated = True
            self._finish(episode)
            return
        episode.turn_starts = [len(head) + start - kept_from for start in episode.turn_starts[-keep:]]
        record.window_starts.append(len(record.input_ids))
        episode.ids = []
        self._extend(episode, window, [0] * len(window), [0.0] * len(window))

    def _summarize(self, episodes: list[_Episode], policy: Policy) -> None:
        """Ask each episode whose cut is due for its summary (`rollout.summarize`), in one
        batch: the request as a user message after the window's last turn, the summary as a
        reply (a model's ids trained, in this window), then the cut. An episode whose window
        has no room left for the request and the summary is truncated."""
        request = self.config.summary_prompt
        asked, prompts = [], []
        for episode in episodes:
            delta = []
            if policy.encoder is not None:
                delta = policy.encoder.user_delta(episode.record.messages[:-1], request)
                if len(episode.ids) + len(delta) + self.config.summary_tokens > self.config.max_context:
                    episode.record.truncated = True
                    self._finish(episode)
                    continue
            asked.append((episode, delta))
            prompts.append(episode.ids + delta)
        if not asked:
            return
        streams = {} if self._sampling_seed is None else {"streams": [e.stream for e, _ in asked]}
        summaries = policy.act([e.env for e, _ in asked], prompts, self.config.summary_tokens,
                               # Asked after the window's last reply, as a model is (the new observation follows the cut).
                               conversations=[[*self._shown_messages(e)[:-1], {"role": "user", "content": request}]
                                              for e, _ in asked], **streams)
        for (episode, delta), summary in zip(asked, summaries):
            if summary.error is not None:
                episode.record.error = summary.error
                self._finish(episode)
                continue
            turns_end = len(episode.ids)
            if policy.encoder is not None:
                ids = list(summary.ids) + _closing(summary, policy)
                self._extend(episode, delta, [0] * len(delta), [0.0] * len(delta))
                self._extend(episode, ids, [1] * len(summary.ids) + [0] * (len(ids) - len(summary.ids)),
                             list(summary.logprobs) + [0.0] * (len(ids) - len(summary.ids)))
            episode.summary = summary.text.strip()
            episode.record.summaries.append({"turns": episode.record.turns, "text": summary.text})
            observation, episode.awaiting_summary = episode.awaiting_summary, None
            self._open_window(episode, observation, policy, turns_end)

    def _opening(self, episode: _Episode) -> list[dict[str, Any]]:
        """The messages a context window opens with; once turns are left out, the first
        observation ends with a note of how many, and the policy's summary of them."""
        opening = [dict(message) for message in episode.record.messages[:episode.opening]]
        hidden = episode.shown_from
        if hidden:
            said = f". Your summary of them: {episode.summary}" if episode.summary else ""
            opening[-1]["content"] += f"\n\n[{hidden} earlier turn{'s' * (hidden != 1)} " \
                                      f"{'are' if hidden != 1 else 'is'} not shown{said}]"
        return opening

    def _shown_messages(self, episode: _Episode) -> list[dict[str, Any]]:
        """The conversation a text policy (a chat API's model) is shown: the opening and the turns
        from `shown_from` on (a turn is a reply and the observation after it)."""
        if not episode.shown_from:
            return episode.record.messages
        return [*self._opening(episode), *episode.record.messages[episode.opening + 2 * episode.shown_from:]]

    def _within_budget(self, observation: str, policy: Policy) -> str:
        """`observation` cut to `rollout.max_observation_tokens` of the policy's tokenizer
        (characters ÷ 4 for a text policy), saying how much was cut; as it is when it fits."""
        budget = self.config.max_observation_tokens
        if not budget:
            return observation
        if policy.encoder is None:
            if len(observation) <= 4 * budget:
                return observation
            return f"{observation[:4 * budget]} [... {len(observation) - 4 * budget} characters cut]"
        ids = policy.encoder.encode_text(observation)
        if len(ids) <= budget:
            return observation
        return f"{policy.encoder.tokenizer.decode(ids[:budget])} [... {len(ids) - budget} tokens cut]"

    @staticmethod
    def _extend(episode: _Episode, ids: list[int], mask: list[int], logprobs: list[float]) -> None:
        episode.ids += ids
        episode.record.input_ids += ids
        episode.record.loss_mask += mask
        episode.record.logprobs += logprobs

    def _fail(self, episode: _Episode, error: BaseException) -> _Episode:
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        episode.record.error = last
        self._finish(episode)
        return episode

    def _finish(self, episode: _Episode) -> None:
        if self.reward is not None and episode.record.error is None:
            try:
                self.reward.apply(episode.record, episode.info)
            except Exception as error:  # noqa: BLE001 — a reward that fails fails its episode, as data
                last = traceback.format_exception_only(type(error), error)[-1].strip()
                episode.record.error = f"{self.reward.name}: {last}"
                episode.reward_failed = True
        episode.done = True
        env, episode.env = episode.env, None
        if env is None:
            return
        if episode.record.error is not None and not episode.reward_failed:  # it may be broken: never reuse it
            _close_quietly(env)
            return
        with self._idle_lock:
            self._idle.append(env)

    @staticmethod
    def _report(episodes: list[_Episode], progress: Callable[[int], Any] | None) -> None:
        if progress is not None:
            finished = sum(1 for e in episodes if e.done)
            if finished:
                progress(finished)


def _records(episodes: list[_Episode]) -> list[Trajectory]:
    """The episodes' trajectories task by task, each task's samples in their order (a retried
    sample, started after its group-mates, and branches, added as their trunks reached the fork,
    back in place: `algo.greedy_samples` reads the first ones), without the dropped attempts."""
    return [e.record for e in sorted(episodes, key=lambda e: (e.group, e.sample)) if not e.dropped]


def _test_tasks(env_id: str) -> list[Task]:
    """The test split of a registered environment with its default arguments (none for an
    environment this process does not know, or whose split needs arguments: both UserErrors)."""
    try:
        return registry.tasks(env_id, "test")
    except UserError:
        return []


def _closing(reply: Reply, policy: Policy) -> list[int]:
    """The end-of-turn token a token policy's reply needs after it: none when the reply ended
    with it, one when the token limit cut the reply or a `rollout.stop_strings` token ended it."""
    end = policy.encoder.end_of_turn_id
    return [] if reply.ids[-1:] == [end] else [end]


def _temperature(policy: Policy) -> float | None:
    """The sampling temperature of a model policy's generator (0: greedy); None for a policy
    without one (a scripted expert, a text policy)."""
    return getattr(getattr(policy, "generator", None), "temperature", None)


def _close_quietly(env: TextEnv) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 — a failing close must not lose the episode
        pass
