"""Expert collection: in several processes the same episodes as in one; perturbed demonstrations."""

import pytest
from conftest import CounterExpert

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.config import RolloutConfig
from agentgym_rl.train import demonstrations
from agentgym_rl.train.demonstrations import EPISODES_PER_PROCESS, collect_expert
from agentgym_rl.train.finetune import encode_demonstrations


@pytest.mark.parametrize("perturb", [0.0, 0.3])
def test_expert_processes_give_the_episodes_of_one_process(monkeypatch, perturb):
    episodes = 2 * EPISODES_PER_PROCESS + 5  # enough for two processes, slices of unequal length
    one = collect_expert("textcraft", "train", episodes, rollout=RolloutConfig(expert_processes=1), perturb=perturb)
    pools = []

    class CountedPool(demonstrations.ProcessPoolExecutor):
        def __init__(self, workers, **kwargs):
            pools.append(workers)
            super().__init__(workers, **kwargs)

    monkeypatch.setattr(demonstrations, "ProcessPoolExecutor", CountedPool)
    seen = []
    two = collect_expert("textcraft", "train", episodes, rollout=RolloutConfig(expert_processes=2),
                         progress=seen.append, perturb=perturb)
    assert pools == [2]  # the episodes really were played in two processes
    assert sum(seen) == episodes
    assert [t.item_id for t in two] == [t.item_id for t in one]
    assert [t.group for t in two] == list(range(episodes))
    assert [t.messages for t in two] == [t.messages for t in one]
    assert all(t.success for t in two) or perturb
    perturbed = sum(m.get("loss") is False for t in two for m in t.messages)
    assert (perturbed > 0) == (perturb > 0)


def test_perturbed_turns_are_context_and_the_expert_recovers_from_them(counter_env_registered, tiny_tokenizer):
    """Counter: the expert says "count" until the goal; a perturbation ("look", or a "count" it
    did not choose) is kept untrained. Every episode still succeeds, the expert's turns after a
    perturbation are trained, and the loss mask leaves the perturbed replies out."""
    trajectories = collect_expert("counter", "train", 30, seed=3, perturb=0.5, max_turns=12,
                                  rollout=RolloutConfig(expert_processes=1))
    expert_reply = CounterExpert().act(None)
    replies = [m for t in trajectories for m in t.messages if m["role"] == "assistant"]
    perturbed = [m for m in replies if m.get("loss") is False]
    # Counter's 30 items start from 3 observations, so draws repeat: a loose band around 0.5.
    assert 0.2 < len(perturbed) / len(replies) < 0.8
    assert all(m["content"] == expert_reply for m in replies if m.get("loss") is not False)
    assert {m["content"] for m in perturbed} == {"Action: look", "Action: count"}
    assert all(t.success for t in trajectories)
    flags = [[m.get("loss") is not False for m in t.messages if m["role"] == "assistant"] for t in trajectories]
    assert any(not a and b for f in flags for a, b in zip(f, f[1:]))  # an expert turn right after a perturbation
    encoder = ChatEncoder(tiny_tokenizer)
    for t in encode_demonstrations(encoder, trajectories[:5]):
        trained = encoder.tokenizer.decode([i for i, m in zip(t.input_ids, t.loss_mask) if m])
        replies = [m for m in t.messages if m["role"] == "assistant"]
        assert trained.count("Action: count") == sum(m.get("loss") is not False for m in replies)
        assert "look" not in trained
    again = collect_expert("counter", "train", 30, seed=3, perturb=0.5, max_turns=12,
                           rollout=RolloutConfig(expert_processes=1))
    assert [t.messages for t in again] == [t.messages for t in trajectories]
