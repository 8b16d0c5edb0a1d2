"""Environments in Ray actors (`env.urls: [ray:local]`): a rollout through them equals the
in-process rollout with the same seeds, the env contract holds through the actor, and bad
arguments or addresses are one-line errors."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from test_cli import CLI, run
from test_env_e2e import TINY_RUN
from test_run_safety import REPO

from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvStateError
from agentgym_rl.envs.checker import check_env
from agentgym_rl.envs.ray_env import RayEnvError, parse_address, split_actor_budget
from agentgym_rl.errors import UserError
from agentgym_rl.eval.policies import RandomPolicy
from agentgym_rl.rollout.engine import RolloutEngine

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def on_ray(ray_instance):
    return registry.env_factory("babyai", {}, ["ray:local?cpus=0.25"], timeout=60)


@pytest.mark.parametrize("url, parsed", [
    ("ray:local", (None, 0.25)), ("ray:auto?cpus=0.5", ("auto", 0.5)), ("ray://head:10001", ("ray://head:10001", 0.25)),
])
def test_ray_addresses(url, parsed):
    assert parse_address(url) == parsed


@pytest.mark.parametrize("url", ["ray:somewhere", "ray:local?cpus=0", "ray:local?cpus=x"])
def test_bad_ray_addresses_are_refused(url):
    with pytest.raises(ValueError):
        parse_address(url)


def test_a_ray_rollout_equals_the_in_process_one(on_ray):
    tasks = registry.tasks("babyai", "test")[:5]
    with RolloutEngine(registry.env_factory("babyai"), RolloutConfig(max_envs=2)) as engine:
        local = engine.run(tasks, RandomPolicy(7), 6, samples=2, seed=3)
    # One engine for both policies: its two actors (a process each, seconds to start) are reused.
    with RolloutEngine(on_ray, RolloutConfig(max_envs=2)) as engine:
        remote = engine.run(tasks, RandomPolicy(7), 6, samples=2, seed=3)
        expert = engine.run(tasks, registry.make_expert("babyai"), 6, seed=3)  # it asks through the actor
        assert engine.envs_made == 2
    assert [t.messages for t in remote] == [t.messages for t in local]
    assert [(t.reward, t.success, t.turns) for t in remote] == [(t.reward, t.success, t.turns) for t in local]
    assert all(t.error is None for t in remote)
    assert all(t.success for t in expert)


def test_the_env_contract_holds_through_an_actor(on_ray):
    check_env(on_ray(), item_id=3)
    env = on_ray()
    with pytest.raises(EnvStateError):  # the environment's own exception comes back as itself
        env.step("go forward")
    env.close()
    with pytest.raises(EnvStateError):
        env.reset(0)


def test_a_dead_actor_fails_its_episode_not_the_run(on_ray):
    env = on_ray()
    env.reset(0)
    ray.kill(env._actor)
    # `ray.kill` returns before the actor is gone: calls sent soon after can still be served.
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(env._actor.__ray_ready__.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "the killed actor still answers after 60 s"
        time.sleep(0.05)
    with pytest.raises(RayEnvError, match="died"):
        env.step("go forward")


def test_bad_environment_arguments_are_a_user_error(on_ray):
    with pytest.raises(UserError, match="unexpected keyword argument 'nope'"):
        registry.env_factory("babyai", {"nope": 1}, ["ray:local"])
    with pytest.raises(UserError, match="must be the only entry"):
        registry.env_factory("babyai", {}, ["ray:local", "http://127.0.0.1:1"])


def test_eval_on_ray_through_the_cli(tmp_path, ray_instance):
    out = tmp_path / "summary.json"
    # In this process, so that it joins the session's Ray instance; one actor (seconds to start).
    result = run("eval", "--env", "babyai", "--policy", "expert", "--episodes", "4", "--json", str(out),
                 "env.urls=[ray:local]", "rollout.max_envs=1")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["episodes"] == 4 and summary["success"] == 1.0 and summary["errors"] == 0


@pytest.mark.parametrize("budget, train_need, val_need, expected", [
    (8, 128, 90, (4, 4)),  # validation up to half the actors
    (8, 128, 3, (5, 3)),   # no more than it plays at once; training takes the rest
    (8, 4, 0, (4, 0)),     # no validation: training alone, no more than it needs
    (3, 8, 2, (2, 1)),
])
def test_training_and_validation_share_the_clusters_actors(budget, train_need, val_need, expected):
    assert split_actor_budget(budget, train_need, val_need) == expected
    assert sum(expected) <= budget


def test_one_actor_cannot_serve_training_and_validation():
    with pytest.raises(ValueError, match="1 actor"):
        split_actor_budget(1, 8, 2)


def test_an_actor_past_the_clusters_room_is_refused_at_once(ray_instance):
    make = registry.env_factory("babyai", {}, ["ray:local?cpus=1"], timeout=60)  # 2 CPUs: room for 2
    assert make.actor_budget == 2
    envs = [make(), make()]
    try:
        began = time.monotonic()
        with pytest.raises(RayEnvError, match="places 2 .* all are in use"):
            make()
        assert time.monotonic() - began < 1
        envs.pop().close()
        envs.append(make())  # a closed actor's room is taken again
    finally:
        for env in envs:
            env.close()


def ray_processes() -> set[int]:
    """PIDs of this machine's Ray processes (raylet, GCS, agents, workers)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and any(name in command for name in (b"raylet", b"gcs_server", b"dashboard",
                                                                        b"runtime_env", b"ray::", b"default_worker")):
            found.add(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_with_validation_on_ray_actors_trains_and_stops_clean(tmp_path):
    """At the default settings (0.25 CPU an actor: 8 on 2 CPUs), training's 8 episodes a step and
    validation's actors, kept for reuse, once asked for more actors than the cluster places: step
    1 never ended. A run stopped by SIGTERM leaves no Ray process behind."""
    before = ray_processes()
    command = [*CLI, "train", str(REPO / "configs" / "babyai_grpo.yaml"), *TINY_RUN, f"run.output_dir={tmp_path}",
               "run.name=run", "env.id=babyai", "env.urls=[ray:local]", "rollout.max_envs=0", "algo.tasks_per_step=4",
               "algo.group_size=2", "train.steps=100", "train.validate_every=1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("step 1: validation success"):
                break
        assert lines and lines[-1].startswith("step 1: validation success"), "".join(lines[-30:])
        process.terminate()
        assert process.wait(60) == 143
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "val/success" in row][:2] == [0, 1]
    assert all(row["train/errors"] == 0 for row in rows if "train/errors" in row)
    deadline = time.monotonic() + 15
    while ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes() - before


def test_an_environment_that_makes_its_instruction_gives_it_from_its_actor(ray_instance):
    """An MCP environment lists its server's tools in its instruction, made by the instance: an
    environment in a Ray actor takes the built one's, not its class's generic line."""
    from agentgym_rl.envs import registry

    env = registry.env_factory("mcp", {}, ["ray:local"])()  # the factory's probe read it from its actor
    try:
        assert "JSON Schema" in env.instruction and "final_answer" in env.instruction
    finally:
        env.close()
