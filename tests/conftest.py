"""Shared fixtures: a tiny tokenizer, scripted generators and a toy environment."""

from __future__ import annotations

import pytest

from agentgym_rl.agent.generator import Generation
from agentgym_rl.agent.tiny import train_tokenizer
from agentgym_rl.envs.base import EnvStateError, TextEnv

CORPUS = [
    "Your goal: go to the red ball. You see a red ball 1 and a grey key 2 steps in front of you.",
    "Thought: I should go to the ball.\nAction: go to red ball 1",
    "You completed the mission. Counter value is 3. Nothing happens. Available actions: look, count",
] * 20


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=400)


class CounterEnv(TextEnv):
    """A toy game: say "count" `item` times to win; anything else is invalid."""

    env_id = "counter"
    instruction = "Say count until the counter reaches the goal."

    def __init__(self):
        self.goal = None
        self.count = 0
        self.closed = 0

    def reset(self, item_id=None, seed=None):
        self.goal = 1 + int(str(item_id or 0).split("_")[-1]) % 3
        self.count = 0
        return f"Goal: count to {self.goal}.", {"item_id": f"counter_{self.goal}"}

    def step(self, action):
        if self.goal is None:
            raise EnvStateError("reset first")
        invalid = "count" not in action
        if not invalid:
            self.count += 1
        success = self.count >= self.goal
        obs = "Nothing happens." if invalid else f"Counter value is {self.count}."
        return obs, float(success), success, False, {"success": success, "invalid_action": invalid}

    def available_actions(self):
        return ["count", "look"]

    def close(self):
        self.closed += 1


class ScriptedGenerator:
    """Returns the canonical ids of fixed replies, cycling; logprob -1 per token."""

    def __init__(self, tokenizer, replies, stop_id, finish=True):
        self.tokenizer, self.replies, self.stop_id, self.finish = tokenizer, replies, stop_id, finish
        self.calls = 0
        self.prompts: list[list[int]] = []

    def generate(self, prompts, max_new_tokens):
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            text = self.replies[self.calls % len(self.replies)]
            self.calls += 1
            ids = self.tokenizer.encode(text, add_special_tokens=False)[:max_new_tokens]
            if self.finish:
                ids = ids + [self.stop_id]
            out.append(Generation(ids, [-1.0] * len(ids), self.finish))
        return out
