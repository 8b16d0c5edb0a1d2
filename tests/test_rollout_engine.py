"""The rollout engine's scheduling: a cap on live environments keeps task order and results;
environments are reused across episodes and runs, and a reused one plays exactly as a fresh one."""

from __future__ import annotations

import json
import threading

import pytest
from conftest import CounterEnv, CounterExpert

from agentgym_rl.agent.tiny import TinyModelConfig
from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvExpert
from agentgym_rl.envs.tasks import Task
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import ScriptedPolicy


class _LiveCounter:
    """An env factory that records how many environments are open at once."""

    def __init__(self):
        self.live = 0
        self.most = 0
        self.lock = threading.Lock()

    def __call__(self):
        factory = self

        class Tracked(CounterEnv):
            def close(self):
                if not self.closed:
                    with factory.lock:
                        factory.live -= 1
                super().close()

        with self.lock:
            self.live += 1
            self.most = max(self.most, self.live)
        return Tracked()


def test_max_envs_caps_live_environments_and_keeps_order():
    tasks = [Task("counter", i, "c") for i in range(7)]
    capped, free = _LiveCounter(), _LiveCounter()
    with RolloutEngine(capped, RolloutConfig(max_envs=2)) as engine:
        out = engine.run(tasks, CounterExpert(), max_turns=3, samples=2)
    with RolloutEngine(free, RolloutConfig()) as engine:
        reference = engine.run(tasks, CounterExpert(), max_turns=3, samples=2)
    assert capped.most == 2 and free.most == 14
    assert capped.live == 0 and free.live == 0  # closing the engine closed what it kept
    assert [(t.item_id, t.group, t.turns, t.success) for t in out] == \
        [(t.item_id, t.group, t.turns, t.success) for t in reference]


def test_each_turn_records_the_state_its_action_was_taken_from():
    # Item 2's goal is 3 counts; the counter names its state by the count (conftest.CounterEnv).
    with RolloutEngine(CounterEnv) as engine:
        [trajectory] = engine.run([Task("counter", 2, "c")], CounterExpert(), max_turns=5)
    assert trajectory.turns == 3 and trajectory.state_keys == ["0", "1", "2"]

    class Unnamed(CounterEnv):
        def step(self, action):
            *result, info = super().step(action)
            return (*result, {k: v for k, v in info.items() if k != "state_key"})

    with RolloutEngine(Unnamed) as engine:
        [trajectory] = engine.run([Task("counter", 2, "c")], CounterExpert(), max_turns=5)
    assert trajectory.state_keys == ["0", "", ""]  # only reset's info named one


def test_the_factory_limit_applies_when_the_config_sets_none():
    counter = _LiveCounter()
    counter.max_parallel = 3
    finished = []
    with RolloutEngine(counter) as engine:
        engine.run([Task("counter", i, "c") for i in range(5)], CounterExpert(), max_turns=3, progress=finished.append)
    assert counter.most == 3 and sum(finished) == 5


class _BatchOfThree(ScriptedPolicy):
    max_batch = 3


def test_the_smaller_of_the_factory_and_policy_limits_applies():
    """A model policy keeps its KV cache for a batch of `max_batch` episodes: more at once would
    be prefilled afresh every turn."""
    limits = []
    for factory_cap in (0, 2, 5):
        counter = _LiveCounter()
        counter.max_parallel = factory_cap
        with RolloutEngine(counter) as engine:
            out = engine.run([Task("counter", i, "c") for i in range(5)], _BatchOfThree(CounterExpert()), max_turns=3, samples=2)
        assert len(out) == 10 and all(t.success for t in out)
        limits.append(counter.most)
    assert limits == [3, 2, 3]


class _HeavyCache(ScriptedPolicy):
    """A model whose KV cache holds 1 MiB a token (a large one, at a small scale)."""

    max_batch = 128
    cache_bytes_per_token = 2**20


def test_episodes_in_flight_are_capped_by_the_kv_cache_budget():
    """2 episodes of 1,000 tokens at 1 MiB a token fill 2,000 MB: the third must wait; a set
    max_envs overrides the budget."""
    tasks = [Task("counter", i, "c") for i in range(5)]
    for config, most in ((RolloutConfig(max_context=1000, kv_cache_mb=2000), 2),
                         (RolloutConfig(max_context=1000, kv_cache_mb=1), 1),
                         (RolloutConfig(max_context=1000, kv_cache_mb=2000, max_envs=4), 4)):
        counter = _LiveCounter()
        with RolloutEngine(counter, config) as engine:
            out = engine.run(tasks, _HeavyCache(CounterExpert()), max_turns=3)
        assert len(out) == 5 and counter.most == most


def test_a_model_policy_reports_its_models_kv_bytes_per_token(tiny_tokenizer):
    from agentgym_rl.agent.tiny import build_model
    from agentgym_rl.rollout.backends import model_policy

    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2))
    # K and V, 3 layers, 2 heads of 8 dimensions, 4 bytes each.
    assert model_policy(model, tiny_tokenizer, 0.0).cache_bytes_per_token == 2 * 3 * 2 * 8 * 4


def test_environments_are_reused_across_episodes_and_runs():
    """Two runs of 14 episodes, at most 2 at once: 2 environments are made in all, none closed
    until the engine is; the second run plays as the first."""
    counter = _LiveCounter()
    tasks = [Task("counter", i, "c") for i in range(7)]
    engine = RolloutEngine(counter, RolloutConfig(max_envs=2))
    first = engine.run(tasks, CounterExpert(), max_turns=3, samples=2)
    second = engine.run(tasks, CounterExpert(), max_turns=3, samples=2)
    assert engine.envs_made == 2 and counter.live == 2
    assert [t.messages for t in second] == [t.messages for t in first]
    engine.close()
    assert counter.live == 0


class _BreaksOnItem3(CounterEnv):
    def reset(self, item_id=None, seed=None):
        if str(item_id).endswith("3"):
            raise RuntimeError("broken")
        return super().reset(item_id, seed)


def test_an_environment_that_raised_is_closed_and_never_reused():
    made: list[CounterEnv] = []

    def factory():
        made.append(_BreaksOnItem3())
        return made[-1]

    with RolloutEngine(factory, RolloutConfig(max_envs=1)) as engine:
        out = engine.run([Task("counter", i, "c") for i in range(6)], CounterExpert(), max_turns=3)
        assert [t.error is not None for t in out] == [False, False, False, True, False, False]
        assert len(made) == 2 and made[0].closed == 1 and made[1].closed == 0  # the first broke on item 3
    assert made[1].closed == 1


@pytest.mark.parametrize("env_id, items, max_turns", [("babyai", 6, 20), ("textcraft", 6, 20), ("sciworld", 2, 12)])
def test_a_reused_environment_plays_as_a_fresh_one(env_id, items, max_turns):
    """The expert's episodes on one environment reset again and again (sciworld: one JVM) equal
    those on a new environment per episode: a reset leaves nothing of the episode before."""
    tasks = registry.tasks(env_id, "test")[:items]
    with RolloutEngine(registry.env_factory(env_id), RolloutConfig(max_envs=1)) as engine:
        reused = engine.run(tasks, EnvExpert(), max_turns)
        assert engine.envs_made == 1
    # The first episode was already played on a new environment: the others are replayed on one each.
    fresh = reused[:1]
    for task in tasks[1:]:
        with RolloutEngine(registry.env_factory(env_id), RolloutConfig(max_envs=1)) as engine:
            fresh += engine.run([task], EnvExpert(), max_turns)
    assert all(t.error is None for t in reused + fresh)
    assert [t.messages for t in reused] == [t.messages for t in fresh]
    assert [t.turn_rewards for t in reused] == [t.turn_rewards for t in fresh]


def test_forked_samples_share_the_turns_before_the_fork_and_differ_after():
    """rollout.fork_at=2 on TextCraft: the trunk's first two turns are every sample's; after
    them each branch plays its own replies in its own restored environment. A trunk that ends
    sooner leaves its samples to start afresh."""
    from agentgym_rl.eval.policies import RandomPolicy

    tasks = registry.tasks("textcraft", "train")[:3]
    with RolloutEngine(registry.env_factory("textcraft"), RolloutConfig(fork_at=2)) as engine:
        played = engine.run(tasks, RandomPolicy(5), max_turns=6, samples=4, seed=1)
    assert [t.group for t in played] == [0] * 4 + [1] * 4 + [2] * 4
    for group in range(3):
        samples = [t for t in played if t.group == group]
        assert all(t.error is None and t.turns >= 3 for t in samples)
        prefix = samples[0].messages[:5]  # the first observation and two turns
        assert all(t.messages[:5] == prefix and t.state_keys[:3] == samples[0].state_keys[:3] for t in samples)
        assert len({json.dumps(t.messages[5:]) for t in samples}) > 1  # the random replies differ after the fork
    # An environment that cannot snapshot is named.
    with RolloutEngine(CounterEnv, RolloutConfig(fork_at=1)) as engine, pytest.raises(UserError, match="fork_at"):
        engine.run([Task("counter", 2, "c")], CounterExpert(), max_turns=5, samples=2)
    # A trunk that ends before the fork: its samples are played from the start.
    with RolloutEngine(CounterEnv, RolloutConfig(fork_at=5)) as engine:
        whole = engine.run([Task("counter", 0, "c")], CounterExpert(), max_turns=5, samples=3)
    assert [t.turns for t in whole] == [1, 1, 1] and all(t.success for t in whole)
    # A trunk whose environment failed at its reset, no retry left: its samples are played still.

    class FailsItem1(CounterEnv):
        def reset(self, item_id=None, seed=None):
            if str(item_id).endswith("1"):
                raise ConnectionError("the server went away")
            return super().reset(item_id, seed)

    with RolloutEngine(FailsItem1, RolloutConfig(fork_at=5)) as engine:
        played = engine.run([Task("counter", 0, "c"), Task("counter", 1, "c")], CounterExpert(), max_turns=5,
                            samples=3)
    assert [t.group for t in played] == [0, 0, 0, 1, 1, 1]
    assert [t.error is not None for t in played] == [False] * 3 + [True] * 3


def test_an_episode_whose_environment_failed_is_played_again_while_retries_allow():
    """Every third reset of an environment fails: with rollout.episode_retries the failed
    attempts are dropped and played again elsewhere, so every sample of every task comes back
    whole; without retries they come back as recorded failures."""
    calls = {"n": 0}
    lock = threading.Lock()

    class Flaky(CounterEnv):
        def reset(self, item_id=None, seed=None):
            with lock:
                calls["n"] += 1
                fail = calls["n"] % 3 == 0
            if fail:
                raise ConnectionError("the server went away")
            return super().reset(item_id, seed)

    tasks = [Task("counter", i, "c") for i in range(4)]
    with RolloutEngine(Flaky, RolloutConfig(episode_retries=3)) as engine:
        played = engine.run(tasks, CounterExpert(), max_turns=5, samples=3)
        assert engine.retried > 0
    assert [t.group for t in played] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert all(t.error is None and t.success for t in played)
    calls["n"] = 0
    with RolloutEngine(Flaky, RolloutConfig()) as engine:
        kept = engine.run(tasks, CounterExpert(), max_turns=5, samples=3)
    assert len(kept) == 12 and sum(t.error is not None for t in kept) == 4


def test_with_a_sampling_seed_an_episode_samples_the_same_in_any_batch(tiny_tokenizer):
    """Each episode draws from its own stream (seed, task, sample): task 2's samples are the same
    played beside tasks 0 and 1 or alone; its two samples differ, and so does another seed."""
    from agentgym_rl.agent.tiny import build_model
    from agentgym_rl.rollout.backends import model_policy

    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, max_positions=512))
    config = RolloutConfig(max_new_tokens=8, threads=1)
    policy = model_policy(model, tiny_tokenizer, 1.0, config)
    tasks = [Task("counter", i, "c") for i in range(3)]
    with RolloutEngine(CounterEnv, config) as engine:
        together = engine.run(tasks, policy, 3, samples=2, sampling_seed=11)
        alone = engine.run(tasks[2:], policy, 3, samples=2, sampling_seed=11)
        other_seed = engine.run(tasks[2:], policy, 3, samples=2, sampling_seed=12)
    assert [t.input_ids for t in together[4:]] == [t.input_ids for t in alone]
    for mate, single in zip(together[4:], alone):
        assert mate.logprobs == pytest.approx(single.logprobs, abs=1e-5)
    assert alone[0].input_ids != alone[1].input_ids and alone[0].input_ids != other_seed[0].input_ids



def test_greedy_samples_play_the_first_of_each_group_as_a_greedy_run_does(tiny_tokenizer):
    """With greedy_samples=1, each task's first sample is the episode a greedy policy plays and its
    second the one the sampled run plays; without a sampling seed it is refused."""
    from agentgym_rl.agent.tiny import build_model
    from agentgym_rl.rollout.backends import model_policy

    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, max_positions=512))
    config = RolloutConfig(max_new_tokens=8, threads=1)
    tasks = [Task("counter", i, "c") for i in range(2)]
    sampled_policy = model_policy(model, tiny_tokenizer, 1.0, config)
    with RolloutEngine(CounterEnv, config) as engine:
        mixed = engine.run(tasks, sampled_policy, 3, samples=2, sampling_seed=11, greedy_samples=1)
        sampled = engine.run(tasks, sampled_policy, 3, samples=2, sampling_seed=11)
        greedy = engine.run(tasks, model_policy(model, tiny_tokenizer, 0.0, config), 3)
        with pytest.raises(ValueError, match="sampling_seed"):
            engine.run(tasks, sampled_policy, 3, samples=2, greedy_samples=1)
    assert [t.input_ids for t in mixed[0::2]] == [t.input_ids for t in greedy]
    assert [t.input_ids for t in mixed[1::2]] == [t.input_ids for t in sampled[1::2]]
    assert [t.input_ids for t in sampled[0::2]] != [t.input_ids for t in greedy]


def test_a_retried_sample_comes_back_in_its_place_among_its_group():
    """A sample played again after a failed attempt starts after its group-mates; the run still
    returns each task's samples in their order (the first ones are `algo.greedy_samples`')."""
    from types import SimpleNamespace

    from agentgym_rl.rollout.engine import _records

    def episode(group, sample, dropped=False):
        return SimpleNamespace(group=group, sample=sample, dropped=dropped, record=(group, sample))

    played = [episode(0, 0, dropped=True), episode(0, 1), episode(1, 0), episode(1, 1), episode(0, 0)]
    assert _records(played) == [(0, 0), (0, 1), (1, 0), (1, 1)]

def test_a_run_killed_mid_rollout_continues_from_its_journal_as_if_never_stopped(tiny_tokenizer, tmp_path):
    """The policy fails on its 4th turn (as a killed process would stop): the journal, written every
    turn, holds the episodes of turn 3. A new engine given it continues them, restoring each
    unfinished one's environment, and returns what the uninterrupted run returns: every episode
    once, the same tokens, logprobs within 1e-5. A sampling policy's journal without
    sampling_seed is refused; a greedy one's is not."""
    from agentgym_rl.agent.tiny import build_model
    from agentgym_rl.rollout.backends import model_policy
    from agentgym_rl.rollout.journal import Journal

    model = build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, max_positions=4096), seed=3)
    config = RolloutConfig(max_new_tokens=6, threads=1, max_envs=4)
    tasks = registry.tasks("textcraft", "train")[:3]

    def play(policy, journal=None):
        with RolloutEngine(registry.env_factory("textcraft"), config) as engine:
            return engine, engine.run(tasks, policy, 5, samples=2, seed=1, sampling_seed=7, journal=journal)

    _, whole = play(model_policy(model, tiny_tokenizer, 1.0, config))

    class Killed(Exception):
        pass

    policy = model_policy(model, tiny_tokenizer, 1.0, config)
    act, calls = policy.act, []

    def dies_on_the_fourth_turn(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise Killed
        return act(*args, **kwargs)

    policy.act = dies_on_the_fourth_turn
    journal = Journal(tmp_path / "step.journal", key="weights-a", every=1)
    with pytest.raises(Killed):
        play(policy, journal)
    engine, resumed = play(model_policy(model, tiny_tokenizer, 1.0, config), journal)
    assert engine.resumed > 0  # unfinished episodes were continued, not replayed
    assert [(t.group, t.item_id) for t in resumed] == [(t.group, t.item_id) for t in whole]
    assert [t.input_ids for t in resumed] == [t.input_ids for t in whole]
    for a, b in zip(resumed, whole):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5) and a.messages == b.messages
    # Another key (other weights), another temperature or other tasks: the journal is not this
    # run's; played afresh.
    engine, _ = play(model_policy(model, tiny_tokenizer, 0.7, config), journal)
    assert engine.resumed == 0 and engine.reread == 0
    engine, _ = play(model_policy(model, tiny_tokenizer, 1.0, config), Journal(journal.path, key="weights-b"))
    assert engine.resumed == 0
    # Sampling from the process' random state, a resumed episode would sample otherwise: refused.
    with RolloutEngine(registry.env_factory("textcraft"), config) as engine, \
            pytest.raises(ValueError, match="a journal needs sampling_seed"):
        engine.run(tasks, model_policy(model, tiny_tokenizer, 1.0, config), 5, journal=journal)
    # Greedy, nothing is drawn: a journal needs no seed.
    with RolloutEngine(registry.env_factory("textcraft"), config) as engine:
        greedy = Journal(tmp_path / "greedy.journal", key="weights-a", every=1)
        assert len(engine.run(tasks, model_policy(model, tiny_tokenizer, 0.0, config), 5, journal=greedy)) == 3
    # Run again, all three are read back: reported once as done before the run, none as played.
    played, reread = [], []
    with RolloutEngine(registry.env_factory("textcraft"), config) as engine:
        engine.run(tasks, model_policy(model, tiny_tokenizer, 0.0, config), 5, journal=greedy, progress=played.append,
                   reread_progress=reread.append)
    assert (played, reread) == ([], [3])


def test_a_journal_needs_environments_that_snapshot(tmp_path):
    from agentgym_rl.rollout.journal import Journal

    with RolloutEngine(CounterEnv) as engine, pytest.raises(UserError, match="journal_every keeps unfinished"):
        engine.run([Task("counter", 2, "c")], CounterExpert(), max_turns=5, journal=Journal(tmp_path / "j", "k"))
