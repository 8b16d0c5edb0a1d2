"""Shared fixtures: a tiny tokenizer, scripted generators and a toy environment."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

# run.device defaults to "auto": the tests hide any GPU (before torch looks), so that they, and the
# commands they start, give the same numbers on a machine with one.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402

from agentgym_rl.agent.generator import Generation  # noqa: E402
from agentgym_rl.agent.tiny import train_tokenizer  # noqa: E402
from agentgym_rl.envs.base import EnvStateError, TextEnv  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest-xdist worker per core: torch on two threads in each made a
    # small model's steps up to 8x slower (every operation waits for a thread the other worker
    # holds). One thread each, in the commands the tests start too.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_script(name: str) -> ModuleType:
    """The script `bench/<name>.py` loaded as a module (bench/ is no package; its scripts import
    each other, so bench/ is on the path while one loads)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


CORPUS = [
    "Your goal: go to the red ball. You see a red ball 1 and a grey key 2 steps in front of you.",
    "Thought: I should go to the ball.\nAction: go to red ball 1",
    "You completed the mission. Counter value is 3. Nothing happens. Available actions: look, count",
] * 20


def worker_group(nodeid: str) -> str:
    """The tests one pytest-xdist worker runs together (`make test`): a module's, so that its
    module fixtures start once, and all of Ray's modules' (`test_ray_*`), so that one worker
    starts Ray (`ray_instance`)."""
    module = nodeid.split("::", 1)[0]
    return "ray" if Path(module).name.startswith("test_ray") else module


@pytest.hookimpl(optionalhook=True)  # `make test-vllm`'s environment has no pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` hands out `worker_group`s. (pytest-xdist's own `loadgroup` marks do
    not reach its scheduler under pytest 9.2, which no longer reads a test's id from the field
    xdist rewrites: every test was handed out alone, its module fixtures started on both workers.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The groups that hold a slow test first (in the order collected otherwise): a long group
    handed out last leaves the other worker idle (a module of 8-18 s tests without a slow mark,
    handed out last, kept one worker busy 50 s after the other had finished). A Ray test outside
    the Ray modules would start a second Ray instance on the other worker: refused."""
    for item in items:
        if "ray_instance" in item.fixturenames and worker_group(item.nodeid) != "ray":
            raise pytest.UsageError(f"{item.nodeid} uses Ray: put it in a test_ray_* module")
    slow = {worker_group(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: worker_group(item.nodeid) not in slow)  # stable


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
        return f"Goal: count to {self.goal}.", {"item_id": f"counter_{self.goal}", "state_key": "0"}

    def step(self, action):
        if self.goal is None:
            raise EnvStateError("reset first")
        invalid = "count" not in action
        if not invalid:
            self.count += 1
        success = self.count >= self.goal
        obs = "Nothing happens." if invalid else f"Counter value is {self.count}."
        reward = float(success) + (0.0 if invalid else 0.1)
        return obs, reward, success, False, {"success": success, "invalid_action": invalid,
                                             "state_key": str(self.count)}

    def available_actions(self):
        return ["count", "look"]

    def close(self):
        self.closed += 1


class AnyCaseCounterEnv(CounterEnv):
    """The counter game reading "count" in any case ("Counter", "COUNT"): an untrained tiny
    model writes "Counter" (from the observations it was built on) far more often than a
    lowercase "count", so its samples differ in reward more often (the update tests' signal)."""

    env_id = "counter_any_case"

    def step(self, action):
        return super().step(action.lower())


class ScriptedGenerator:
    """Returns the canonical ids of fixed replies, cycling; logprob -1 per token."""

    def __init__(self, tokenizer, replies, stop_id, finish=True):
        self.tokenizer, self.replies, self.stop_id, self.finish = tokenizer, replies, stop_id, finish
        self.calls = 0
        self.prompts: list[list[int]] = []

    def generate(self, prompts, max_new_tokens, streams=None):
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

    for env_id, entry_point in (("counter", "conftest:CounterEnv"), ("counter_any_case", "conftest:AnyCaseCounterEnv")):
        if env_id not in registry.env_ids():
            registry.register(registry.EnvSpec(env_id, entry_point, "conftest:counter_tasks", max_turns=3,
                                               expert_entry_point="conftest:CounterExpert", state_keys=True))
    return "counter"
