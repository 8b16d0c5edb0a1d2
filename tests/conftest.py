"""Shared fixtures: a tiny tokenizer, scripted generators and a toy environment."""

from __future__ import annotations

import os

import pytest
import torch

from agentgym_rl.agent.generator import Generation
from agentgym_rl.agent.tiny import train_tokenizer
from agentgym_rl.envs.base import EnvStateError, TextEnv

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest-xdist worker per core: torch on two threads in each made a
    # small model's steps up to 8x slower (every operation waits for a thread the other worker
    # holds). One thread each, in the commands the tests start too.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

CORPUS = [
    "Your goal: go to the red ball. You see a red ball 1 and a grey key 2 steps in front of you.",
    "Thought: I should go to the ball.\nAction: go to red ball 1",
    "You completed the mission. Counter value is 3. Nothing happens. Available actions: look, count",
] * 20


def _xdist_group(item) -> str:
    """The tests one pytest-xdist worker runs together: a module's (its module fixtures start
    once), and every Ray test (one Ray instance, `ray_instance`, per worker)."""
    return "ray" if "ray_instance" in item.fixturenames else item.module.__name__


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the marks
def pytest_collection_modifyitems(config, items):
    """With `--dist loadgroup` (`make test`), groups run whole on one worker, the groups that
    hold a slow test first: a long group handed out last would leave the other worker idle."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
    slow = {_xdist_group(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _xdist_group(item) not in slow)  # stable: collection order otherwise


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=400)


@pytest.fixture(scope="session")
def ray_instance():
    """One local Ray instance for every test that uses Ray in this process (starting one takes
    ~7 s): the first `ray:local` joins it, commands run in process (`test_cli.run`) reuse it."""
    ray = pytest.importorskip("ray")
    yield ray
    ray.shutdown()


class CounterEnv(TextEnv):
    """A toy game: say "count" 1-3 times (by item) to win; anything else is invalid.

    Each valid count earns 0.1 and success 1, so rewards vary between samples even for an
    untrained model (GRPO then always has a signal to update on)."""

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
        reward = float(success) + (0.0 if invalid else 0.1)
        return obs, reward, success, False, {"success": success, "invalid_action": invalid}

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


class CounterExpert:
    def act(self, env):
        return "Thought: I should count.\nAction: count"


def counter_tasks(split):
    from agentgym_rl.envs.tasks import Task

    indices = range(0, 30) if split == "train" else range(30, 36)
    return [Task("counter", i, f"goal{1 + i % 3}") for i in indices]


@pytest.fixture(scope="session")
def counter_env_registered():
    from agentgym_rl.envs import registry

    if "counter" not in registry.env_ids():
        registry.register(registry.EnvSpec("counter", "conftest:CounterEnv", "conftest:counter_tasks",
                                           max_turns=3, expert_entry_point="conftest:CounterExpert"))
    return "counter"
