"""Replies restricted to the listed actions (`eval.listed_actions_only`): the token trie, the
logits processor, a model policy whose every reply is a listed action while the same model's
free replies are not, and clear errors where the restriction cannot apply."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import CounterEnv, ScriptedGenerator
from test_cli import run
from test_generator_cache import _model

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.constrained import AllowedReplies, allowed_next, build_trie
from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs.tasks import Task
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.backends import model_policy
from agentgym_rl.rollout.policy import ModelPolicy


def test_the_trie_gives_the_tokens_that_continue_an_allowed_sequence():
    trie = build_trie([[1, 2, 9], [1, 3, 9], [4, 9]])
    assert trie == {1: {2: {9: {}}, 3: {9: {}}}, 4: {9: {}}}
    assert allowed_next(trie, []) == [1, 4]
    assert allowed_next(trie, [1]) == [2, 3]
    assert allowed_next(trie, [1, 3]) == [9]
    assert allowed_next(trie, [1, 3, 9]) is None  # complete: the stop token ended it
    assert allowed_next(trie, [5]) is None


def test_the_processor_masks_all_but_the_allowed_tokens_of_each_row():
    # Row 0 generated [1] after a 2-column prompt, so only 2 or 3 may follow; row 1 is free.
    processor = AllowedReplies([[[1, 2, 9], [1, 3, 9]], []], prompt_width=2)
    input_ids = torch.tensor([[7, 7, 1], [7, 7, 5]])
    scores = torch.arange(10, dtype=torch.float).repeat(2, 1)
    out = processor(input_ids, scores.clone())
    assert out[0].tolist() == [float("-inf")] * 2 + [2.0, 3.0] + [float("-inf")] * 6
    assert out[1].tolist() == scores[1].tolist()


def _replies(trajectories):
    return [m["content"] for t in trajectories for m in t.messages if m["role"] == "assistant"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_restricted_reply_is_a_listed_action(tiny_tokenizer, temperature):
    """Three turns on the toy env (the KV cache continued between turns): the restricted
    policy writes only "Action: count" or "Action: look"; the same untrained model, free,
    writes neither."""
    model = _model(tiny_tokenizer)
    tasks = [Task("counter", i, "c") for i in range(4)]
    played = {}
    for restricted in (True, False):
        policy = model_policy(model, tiny_tokenizer, temperature, listed_actions_only=restricted)
        with RolloutEngine(CounterEnv, RolloutConfig(max_new_tokens=8)) as engine:
            played[restricted] = engine.run(tasks, policy, max_turns=3, samples=2, seed=1)
    listed = {"Action: count", "Action: look"}
    assert set(_replies(played[True])) <= listed and len(_replies(played[True])) >= 8
    assert all(t.invalid_actions == sum(r == "Action: look" for r in _replies([t])) for t in played[True])
    assert not set(_replies(played[False])) & listed


def test_a_generator_that_cannot_restrict_and_an_env_that_lists_nothing_are_user_errors(tiny_tokenizer):
    encoder = ChatEncoder(tiny_tokenizer)
    with pytest.raises(UserError, match="cannot restrict replies"):
        ModelPolicy(ScriptedGenerator(tiny_tokenizer, ["x"], encoder.end_of_turn_id), encoder, listed_actions_only=True)

    class Unlisted(CounterEnv):
        def available_actions(self):
            return None

    policy = model_policy(_model(tiny_tokenizer), tiny_tokenizer, 0.0, listed_actions_only=True)
    with RolloutEngine(Unlisted) as engine, pytest.raises(UserError, match="lists no actions"):
        engine.run([Task("counter", 0, "c")], policy, max_turns=1)


def test_eval_restricts_a_model_folders_replies_through_the_cli(tmp_path, tiny_tokenizer, counter_env_registered):
    folder = tmp_path / "model"
    _model(tiny_tokenizer).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    summaries = []
    for flags in (["--listed-actions-only"], []):
        out = tmp_path / f"summary{len(summaries)}.json"
        result = run("eval", "--policy", str(folder), "--env", "counter", "--episodes", "3", "--max-turns", "3",
                     "--max-new-tokens", "8", "--temperature", "1", *flags, "--json", str(out))
        assert result.returncode == 0, result.stderr[-2000:]
        summaries.append(json.loads(out.read_text()))
    restricted, free = summaries
    assert restricted["listed_actions_only"] is True and free["listed_actions_only"] is False
    assert free["invalid_action_rate"] == 1.0 and restricted["invalid_action_rate"] < 1.0
    result = run("eval", "--policy", "expert", "--env", "counter", "--episodes", "1", "--listed-actions-only")
    assert result.returncode != 0 and "is not one" in result.stderr and "Traceback" not in result.stderr


def test_a_training_runs_validation_can_be_restricted(tmp_path, counter_env_registered):
    from test_train_e2e import REPO, TINY

    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.rollout.trajectory import load_trajectories
    from agentgym_rl.train.rl import RLTrainer

    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [
        *TINY, "env.id=counter", "env.kwargs={}", f"run.output_dir={tmp_path}", "run.name=toy", "train.steps=1",
        "train.validate_every=1", "warmup.episodes=0", "model.corpus_episodes=6", "eval.listed_actions_only=true"])
    RLTrainer(config, log=lambda _: None).fit()
    for step in (0, 1):
        replies = _replies(load_trajectories(tmp_path / "toy" / "validation" / f"step_{step:06d}.jsonl"))
        assert replies and set(replies) <= {"Action: count", "Action: look"}
