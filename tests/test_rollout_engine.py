"""The rollout engine's scheduling: a cap on live environments keeps task order and results."""

from __future__ import annotations

import threading

from conftest import CounterEnv, CounterExpert

from agentgym_rl.envs.tasks import Task
from agentgym_rl.config import RolloutConfig
from agentgym_rl.rollout.engine import RolloutEngine


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
    out = RolloutEngine(capped, RolloutConfig(max_envs=2)).run(tasks, CounterExpert(), max_turns=3, samples=2)
    reference = RolloutEngine(free, RolloutConfig()).run(tasks, CounterExpert(), max_turns=3, samples=2)
    assert capped.most == 2 and free.most == 14
    assert capped.live == 0 and free.live == 0
    assert [(t.item_id, t.group, t.turns, t.success) for t in out] == \
        [(t.item_id, t.group, t.turns, t.success) for t in reference]


def test_the_factory_limit_applies_when_the_config_sets_none():
    counter = _LiveCounter()
    counter.max_parallel = 3
    finished = []
    RolloutEngine(counter).run([Task("counter", i, "c") for i in range(5)], CounterExpert(), max_turns=3,
                               progress=finished.append)
    assert counter.most == 3 and sum(finished) == 5
