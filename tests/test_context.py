"""Context management for long episodes (`rollout.max_observation_tokens`): every observation
after the first is cut to a token budget, the model sees and is trained on the cut text, and the
episode stays one token-exact sequence, shorter than without the budget."""

from __future__ import annotations

import pytest
from conftest import CORPUS
from test_model_server import TINY

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.tiny import build_tiny
from agentgym_rl.config import RolloutConfig
from agentgym_rl.eval.evaluate import evaluate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny(CORPUS * 3, tmp_path_factory.mktemp("context") / "model", TINY)


def test_observations_are_cut_to_the_budget_and_the_episode_stays_token_exact(model_dir):
    _, tokenizer = load_model_and_tokenizer(model_dir)
    encoder = ChatEncoder(tokenizer)
    settings = dict(split="test", episodes=3, max_turns=5, temperature=0.0, progress=False,
                    env_kwargs={"list_actions": True})
    _, whole = evaluate("babyai", str(model_dir), rollout=RolloutConfig(max_new_tokens=12), **settings)
    _, cut = evaluate("babyai", str(model_dir), rollout=RolloutConfig(max_new_tokens=12, max_observation_tokens=24),
                      **settings)
    assert all(t.turns > 1 for t in cut)  # long enough for later observations
    for trajectory in cut:
        users = [m["content"] for m in trajectory.messages if m["role"] == "user"]
        for text in users[1:]:
            if text.endswith("tokens cut]"):
                kept = text[: text.rindex(" [... ")]
                assert len(encoder.encode_text(kept)) <= 24 + 1  # decoding then encoding may merge one token
            else:
                assert len(encoder.encode_text(text)) <= 24
        assert any(text.endswith("tokens cut]") for text in users[1:])
        assert trajectory.input_ids == encoder.encode_conversation(trajectory.messages)[0]
    assert sum(len(t.input_ids) for t in cut) < sum(len(t.input_ids) for t in whole)
    first = [next(m["content"] for m in t.messages if m["role"] == "user") for t in (whole[0], cut[0])]
    assert first[0] == first[1] and not first[1].endswith("cut]")  # the task's first observation stays whole
