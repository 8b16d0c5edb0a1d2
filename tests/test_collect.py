"""Expert collection in several processes gives the same episodes as in one."""

from agentgym_rl.config import RolloutConfig
from agentgym_rl.train import demonstrations
from agentgym_rl.train.demonstrations import EPISODES_PER_PROCESS, collect_expert


def test_expert_processes_give_the_episodes_of_one_process(monkeypatch):
    episodes = 2 * EPISODES_PER_PROCESS + 5  # enough for two processes, slices of unequal length
    one = collect_expert("textcraft", "train", episodes, rollout=RolloutConfig(expert_processes=1))
    pools = []

    class CountedPool(demonstrations.ProcessPoolExecutor):
        def __init__(self, workers, **kwargs):
            pools.append(workers)
            super().__init__(workers, **kwargs)

    monkeypatch.setattr(demonstrations, "ProcessPoolExecutor", CountedPool)
    seen = []
    two = collect_expert("textcraft", "train", episodes, rollout=RolloutConfig(expert_processes=2),
                         progress=seen.append)
    assert pools == [2]  # the episodes really were played in two processes
    assert sum(seen) == episodes
    assert [t.item_id for t in two] == [t.item_id for t in one]
    assert [t.group for t in two] == list(range(episodes))
    assert [t.messages for t in two] == [t.messages for t in one]
    assert all(t.success for t in two)
