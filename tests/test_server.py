"""Environments over HTTP: `serve-env`'s app and the `HttpEnv` client, which must be
indistinguishable from the in-process environment for every consumer (check_env, the expert,
the rollout engine), and a server that answers bad requests with the right status."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvExpert, EnvStateError
from agentgym_rl.envs.checker import check_env
from agentgym_rl.envs.remote import HttpEnv, RemoteEnvError
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.server.app import create_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving(env_id: str, port: int | None = None, wrap=None, **options):
    """A real server of `env_id` on loopback, in a thread, for the duration of the block; yields
    its URL. `wrap(app)` may add middleware to the app first."""
    app = create_app(env_id, **options)
    if wrap is not None:
        wrap(app)
    with serving_app(app, port) as url:
        yield url


@contextmanager
def serving_app(app, port: int | None = None):
    """Any ASGI `app` served on loopback in a thread for the duration of the block; yields its URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def wait_until_healthy(url: str, process, seconds: float = 60) -> None:
    """Wait for a server `process` (a subprocess.Popen) to answer `url`/health; fail with its
    stderr if it exits first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            httpx.get(f"{url}/health").raise_for_status()
            return
        except httpx.HTTPError:
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"{url} did not start"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def babyai_url():
    with serving("babyai") as url:
        yield url


@pytest.mark.parametrize("env_id", ["babyai", "textcraft", "sciworld", "search", "web"])
def test_check_env_passes_through_http(env_id):
    with serving(env_id) as url:
        check_env(HttpEnv(url), item_id=3)


def test_snapshots_over_http_fork_episodes_and_only_signed_ones_are_restored(babyai_url, counter_env_registered):
    import base64
    import pickle

    first, second = HttpEnv(babyai_url), HttpEnv(babyai_url)
    first.reset(40)
    first.step("turn left")
    state = first.snapshot()
    moved = first.step("move forward")[0]
    second.reset(3)
    second.restore(state)  # another instance on the server continues the first one's episode
    assert second.step("move forward")[0] == moved
    # The client cannot make the server unpickle what the server did not write.
    forged = base64.b64encode(b"\0" * 32 + pickle.dumps({"format": 1})).decode()
    answer = httpx.post(f"{babyai_url}{second._instance()}/restore", json={"state": forged})
    assert answer.status_code == 422 and "signature" in answer.json()["detail"]
    with pytest.raises(ValueError, match="signature"):
        second.restore(state[:-1] + b"x")
    first.close()  # the server is the module's: leave it no instance
    second.close()
    # Another server restores it only when it shares the key.
    with serving("babyai", snapshot_key=b"k" * 32) as keyed, serving("babyai", snapshot_key=b"k" * 32) as twin:
        one, other = HttpEnv(keyed), HttpEnv(twin)
        one.reset(40)
        other.reset(1)
        other.restore(one.snapshot())
        with pytest.raises(ValueError, match="signature"):
            other.restore(state)
    with serving("counter") as url:  # an environment without snapshots: 501, NotImplementedError
        env = HttpEnv(url)
        env.reset(0)
        with pytest.raises(NotImplementedError):
            env.snapshot()


def test_http_episodes_equal_in_process_episodes(babyai_url):
    """The expert, asked through the API, plays the same episodes over HTTP as in process."""
    tasks = registry.tasks("babyai", "test")[:4]
    with RolloutEngine(registry.env_factory("babyai"), RolloutConfig()) as engine:
        local = engine.run(tasks, EnvExpert(), 20, samples=2)
    with RolloutEngine(registry.env_factory("babyai", urls=[babyai_url]), RolloutConfig(max_envs=3)) as engine:
        remote = engine.run(tasks, EnvExpert(), 20, samples=2)
        assert httpx.get(f"{babyai_url}/v1/status").json()["instances"] == 3  # kept for the next episodes
    assert [t.messages for t in remote] == [t.messages for t in local]
    assert [t.turn_rewards for t in remote] == [t.turn_rewards for t in local]
    assert all(t.success and t.error is None for t in remote)
    assert httpx.get(f"{babyai_url}/v1/status").json()["instances"] == 0  # closing the engine closed them


def test_the_server_answers_mistakes_with_their_status(babyai_url):
    created = httpx.post(f"{babyai_url}/v1/envs").json()["id"]
    base = f"{babyai_url}/v1/envs/{created}"
    assert httpx.post(f"{babyai_url}/v1/envs/999999/reset", json={}).status_code == 404
    assert httpx.post(f"{base}/step", json={"action": "turn left"}).status_code == 409  # before reset
    assert httpx.post(f"{base}/reset", json={"item_id": "babyai_x"}).status_code == 422
    assert httpx.post(f"{base}/reset", json={"item_id": [1]}).status_code == 422
    assert httpx.post(f"{base}/step", json={"act": "x"}).status_code == 422
    assert httpx.post(f"{base}/step", json={"action": "x" * 100_001}).status_code == 422
    assert httpx.post(f"{base}/step", content=b"{", headers={"content-type": "application/json"}).status_code == 422
    assert httpx.post(f"{base}/reset", json={"item_id": 1}).status_code == 200
    assert httpx.delete(base).json() == {"closed": created}
    assert httpx.delete(base).status_code == 404
    assert "/v1/envs/{instance_id}/step" in httpx.get(f"{babyai_url}/openapi.json").json()["paths"]


def test_a_token_guards_every_endpoint():
    with serving("babyai", token="s3cret") as url:
        for method, path in [("GET", "/v1/status"), ("GET", "/v1/info"), ("POST", "/v1/envs"),
                             ("POST", "/v1/envs/1/reset"), ("POST", "/v1/envs/1/step"), ("DELETE", "/v1/envs/1"),
                             ("GET", "/v1/envs/1/available_actions"), ("GET", "/openapi.json"), ("GET", "/docs")]:
            assert httpx.request(method, url + path, json={}).status_code == 401, path
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}  # open to a supervisor's probe, says no more
        with pytest.raises(RemoteEnvError, match="HTTP 401"):
            HttpEnv(url)
        env = HttpEnv(url, token="s3cret")
        observation, _ = env.reset(0)
        assert observation.startswith("Your goal")
        env.close()


def test_instance_limit_and_body_limit():
    with serving("babyai", max_instances=2, max_body_bytes=2_000) as url:
        assert [httpx.post(f"{url}/v1/envs").status_code for _ in range(3)] == [200, 200, 429]
        big = httpx.post(f"{url}/v1/envs/1/step", json={"action": "x" * 5_000})
        assert big.status_code == 413


def test_the_client_starts_a_new_instance_after_a_server_restart():
    port = free_port()
    with serving("babyai", port=port) as url:
        env = HttpEnv(url, retries=20, backoff=0.05)
        env.reset(5)
    with serving("babyai", port=port):
        observation, info = env.reset(5)  # its old instance is gone with the old server
        assert info["item_id"] == "babyai_5" and observation
        assert not env.step("turn left")[4]["invalid_action"]
    with pytest.raises(RemoteEnvError, match="cannot connect"):
        HttpEnv(url, retries=1, backoff=0.01)


def test_step_before_reset_is_an_env_state_error_on_the_client(babyai_url):
    with pytest.raises(EnvStateError):
        HttpEnv(babyai_url).step("turn left")


def test_rl_trains_on_environment_servers(tmp_path, counter_env_registered):
    """`env.urls` puts the rollouts, validation and warm-up demonstrations on the servers, with no
    other change; a bad server list is refused before any work."""
    import json
    from pathlib import Path

    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.errors import UserError
    from agentgym_rl.train.rl import RLTrainer

    toy = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
           "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320",
           "env.id=counter", "env.kwargs={}", "warmup.episodes=4", "warmup.epochs=1", "model.corpus_episodes=6",
           "algo.tasks_per_step=2", "algo.group_size=2", "rollout.max_new_tokens=6", "schedule.horizons=[2]",
           "train.steps=2", "train.validate_every=2", "eval.episodes=2", "optim.micro_batch_size=2",
           f"run.output_dir={tmp_path}"]
    configs = Path(__file__).resolve().parent.parent / "configs"
    with serving("counter") as first, serving("counter") as second:
        config = load_config(RLConfig, configs / "babyai_grpo.yaml", [*toy, f"env.urls=[{first}, {second}]"])
        RLTrainer(config, log=lambda _: None).fit()
        assert httpx.get(f"{first}/v1/status").json()["instances"] == 0
        with pytest.raises(UserError, match="serves 'counter', not 'babyai'"):
            RLTrainer(load_config(RLConfig, configs / "babyai_grpo.yaml", ["env.kwargs={}", f"env.urls=[{first}]"]))
        with pytest.raises(UserError, match="start them with `agentgym-rl serve-env ... --env-arg"):
            RLTrainer(load_config(RLConfig, configs / "babyai_grpo.yaml", [f"env.urls=[{first}]"]))
    rows = [json.loads(line) for line in (tmp_path / "babyai_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/errors" in r] == [1, 2]
    assert all(r["train/errors"] == 0 for r in rows if "train/errors" in r)
    with pytest.raises(UserError, match="cannot connect"):
        RLTrainer(load_config(RLConfig, configs / "babyai_grpo.yaml", [*toy, f"env.urls=[{first}]"]))


def test_serve_env_and_eval_through_the_command_line(tmp_path):
    """`agentgym-rl serve-env` in its own process, without torch, then `eval` playing the expert on it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from test_cli import run

    server = subprocess.Popen([sys.executable, "-m", "agentgym_rl.cli", "serve-env", "babyai", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = server.stdout.readline()  # port 0: a free one, named in the first line
        assert said.startswith("listening on http://127.0.0.1:"), server.communicate()[1][-2000:]
        url = said.split()[2].rstrip("/")
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.ConnectError:
                assert server.poll() is None, server.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "serve-env did not start"
                time.sleep(0.2)
        # An env server needs no model: torch stays out of it (it tripled its start and its memory).
        maps = Path(f"/proc/{server.pid}/maps")
        if maps.exists():
            assert "libtorch" not in maps.read_text()
        out = tmp_path / "summary.json"
        result = run("eval", "--policy", "expert", "--episodes", "3", f"env.urls=[{url}]", "--json", str(out))
        assert result.returncode == 0, result.stderr[-2000:]
        assert json.loads(out.read_text())["success"] == 1.0
    finally:
        server.terminate()
        server.wait(10)
    bad = run("serve-env", "nope")
    assert bad.returncode == 2 and "unknown environment 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def agentgym_action(reply: str) -> str:
    """The action AgentGym's env clients send for a ReAct reply (their `step` strips it so)."""
    import re

    matches = re.findall(r"Action:\s*(.*?)(?=\n|$)", reply, re.DOTALL)
    action = re.sub(r"[^A-Za-z0-9, ]+", "", matches[-1] if matches else "")
    return " ".join(action.split()).strip()


def test_agentgym_babyai_client_requests_are_answered_as_it_reads_them(babyai_url):
    """The requests of AgentGym's BabyAIEnvClient, as it sends them, and the fields it reads; the
    expert's replies (asked through our API) win the episode through AgentGym's endpoints."""
    created = httpx.post(f"{babyai_url}/create")
    assert created.status_code == 200
    env_id = created.json()["id"]
    reset = httpx.post(f"{babyai_url}/reset", json={"data_idx": 0, "id": env_id}).json()
    assert {"observation", "reward", "score", "done"} <= set(reset) and reset["observation"].startswith("Your goal")
    assert reset["done"] is False and reset["score"] == 0
    for _ in range(20):
        reply = httpx.get(f"{babyai_url}/v1/envs/{env_id}/expert_action").json()["action"]
        step = httpx.post(f"{babyai_url}/step", json={"action": agentgym_action(reply), "id": env_id}).json()
        assert {"observation", "reward", "score", "done"} <= set(step)
        if step["done"]:
            break
    assert step["done"] and step["score"] > 0 and step["score"] == step["reward"]
    seen = httpx.get(f"{babyai_url}/observation", params={"id": env_id}).json()
    assert seen["observation"] == step["observation"] and seen["done"] is True
    assert httpx.post(f"{babyai_url}/close", json={"id": env_id}).json() is True
    assert httpx.post(f"{babyai_url}/close", json={"id": env_id}).json() is False
    assert httpx.post(f"{babyai_url}/step", json={"action": "turn left", "id": env_id}).status_code == 404


def test_agentgym_textcraft_client_requests_are_answered_as_it_reads_them():
    with serving("textcraft") as url:
        created = httpx.post(f"{url}/create", json={"minecraft_dir": "agentenv_textcraft/", "commands": None,
                                                    "goal": None}).json()
        assert set(created) == {"id", "observation", "done", "reward"} and "Goal:" in created["observation"]
        env_id = created["id"]
        reset = httpx.post(f"{url}/reset", json={"data_idx": 2, "id": env_id}).json()
        assert reset["id"] == env_id and reset["done"] is False and "Goal:" in reset["observation"]
        for _ in range(20):
            reply = httpx.get(f"{url}/v1/envs/{env_id}/expert_action").json()["action"]
            step = httpx.post(f"{url}/step", json={"action": agentgym_action(reply), "id": env_id}).json()
            assert set(step) == {"observation", "reward", "done"}
            if step["done"]:
                break
        assert step["done"] and step["reward"] == 1.0
        assert httpx.get(f"{url}/observation", params={"id": env_id}).json() == step["observation"]
        assert httpx.get(f"{url}/detail", params={"id": env_id}).json()["done"] is True
        custom = httpx.post(f"{url}/create", json={"minecraft_dir": None, "commands": "craft 1 x", "goal": "x"})
        assert custom.status_code == 422
        assert httpx.post(f"{url}/close", json={"id": env_id}).json() is True


def test_agentgym_sciworld_client_requests_are_answered_as_it_reads_them():
    """SciworldEnvClient's requests: `data_idx` means the same (task, variation) as on AgentGym's
    server; the client reads `task_description` and `observation` apart from reset, and trains on
    the step's `score` (the simulator's, 0..100)."""
    item = 2936  # task 4-1 (find a living thing), variation 0: a short gold path
    with serving("sciworld") as url:
        env_id = httpx.post(f"{url}/create").json()["id"]
        reset = httpx.post(f"{url}/reset", json={"data_idx": item, "id": env_id}, timeout=60).json()
        assert set(reset) == {"task_name", "var_num", "task_description", "observation", "reward", "score",
                              "deleted", "done"}
        assert (reset["task_name"], reset["var_num"]) == ("find-living-thing", 0)
        assert reset["task_description"].startswith("Your task is to find a(n) living thing")
        assert reset["observation"].startswith("This room is called") and reset["done"] is False
        for _ in range(30):
            reply = httpx.get(f"{url}/v1/envs/{env_id}/expert_action", timeout=60).json()["action"]
            action = reply.rsplit("Action:", 1)[-1].strip()  # what the client's ReAct parser sends
            step = httpx.post(f"{url}/step", json={"action": action, "id": env_id}, timeout=60).json()
            assert set(step) == {"observation", "reward", "score", "done"}
            if step["done"]:
                break
        assert step["done"] and step["score"] == 100
        assert httpx.get(f"{url}/observation", params={"id": env_id}).json() == step["observation"]
        detail = httpx.get(f"{url}/detail", params={"id": env_id}).json()
        assert detail["done"] is True and detail["score"] == 100 and detail["task_name"] == "find-living-thing"
        assert httpx.post(f"{url}/reset", json={"data_idx": 10**6, "id": env_id}).status_code == 422
        assert httpx.post(f"{url}/close", json={"id": env_id}).json() is True


@pytest.mark.parametrize("env_id, item", [("babyai", 3), ("textcraft", 2), ("sciworld", 2936)])
def test_agentgym_protocol_client_plays_as_the_in_process_env(env_id, item):
    """`agentgym+http://` URLs drive a server through AgentGym's endpoints (here ours): the
    expert's episode, its actions chosen on an in-process twin, gives the same observations,
    rewards and success there as in process."""
    from agentgym_rl.envs.agentgym_remote import NO_ACTION, AgentGymEnv
    from agentgym_rl.errors import UserError

    with serving(env_id) as url:
        make_remote = registry.env_factory(env_id, urls=[f"agentgym+{url}"])
        remote, local = make_remote(), registry.make(env_id)
        assert isinstance(remote, AgentGymEnv) and remote.instruction == local.instruction
        assert remote.reset(item) == (local.reset(item)[0], {"item_id": f"{env_id}_{item}", "success": False})
        for _ in range(30):
            reply = local.expert_action()
            here, there = local.step(reply), remote.step(reply)
            assert there[:3] == here[:3] and there[4]["success"] == here[4]["success"]
            if here[2]:
                break
        assert here[2] and here[4]["success"]
        with pytest.raises(EnvStateError):
            remote.step(reply)
        remote.reset(item)
        assert remote.step("") == (NO_ACTION, 0.0, False, False, {"item_id": f"{env_id}_{item}", "success": False,
                                                                  "invalid_action": True})
        remote.close()
        local.close()
        assert httpx.get(f"{url}/v1/status").json()["instances"] == 0
        other = "textcraft" if env_id == "babyai" else "babyai"
        with pytest.raises(UserError, match="does not answer as AgentGym's"):
            registry.env_factory(other, urls=[f"agentgym+{url}"])


def test_a_spawned_server_killed_mid_rollout_is_restarted_and_its_episodes_played_again():
    """Two TextCraft servers the run starts itself; the first is killed (SIGKILL) while episodes
    are in flight on it. The watchdog starts it again on its port, the failed episodes are played
    again (rollout.episode_retries), and every sample of every task comes back whole. A snapshot
    the first handed out before it died restores on the other and on its restart."""
    import itertools
    import os
    import signal

    from agentgym_rl.envs.spawned import SpawnedServers

    from agentgym_rl.envs.remote import EnvServer

    servers = SpawnedServers("textcraft", {"variant": 0}, 2, probe_every=0.2)
    try:
        first = HttpEnv(EnvServer(servers.urls[0], token=servers.token))
        first.reset(3)
        first.step("inventory")
        state = first.snapshot()  # signed by server 0, which is about to die
        calls, killed = itertools.count(1), []

        class KillingExpert(EnvExpert):
            def act(self, env):
                if next(calls) == 6:  # a few episodes are in flight on each server by now
                    os.kill(servers.pid(0), signal.SIGKILL)
                    killed.append(True)
                return super().act(env)

        expert = KillingExpert()
        tasks = registry.tasks("textcraft", "test")[:4]
        config = RolloutConfig(episode_retries=5, env_workers=4)
        with RolloutEngine(servers.factory(timeout=10), config) as engine:
            played = engine.run(tasks, expert, 20, samples=2)
            retried = engine.retried
        assert killed and retried > 0
        assert [t.group for t in played] == [0, 0, 1, 1, 2, 2, 3, 3]
        assert all(t.error is None and t.success for t in played)
        deadline = time.monotonic() + 60
        while servers.restarts == 0 or not servers._healthy(0):
            assert time.monotonic() < deadline, "the killed server was not restarted"
            time.sleep(0.2)
        assert httpx.get(f"{servers.urls[0]}/v1/status").status_code == 401  # its token guards it again
        # The servers share a snapshot key, restarts included: either continues the dead one's episode.
        continued = []
        for url in servers.urls:
            env = HttpEnv(EnvServer(url, token=servers.token))
            env.reset(0)
            env.restore(state)
            continued.append(env.step("inventory")[0])
        assert continued[0] == continued[1]
    finally:
        servers.close()


def test_rl_plays_on_servers_it_spawns_and_stops_them(tmp_path):
    """env.spawn_servers: the run starts its own TextCraft servers, plays its rollouts there,
    logs env/server_restarts, and stops them when it ends."""
    import json
    from pathlib import Path

    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.errors import UserError
    from agentgym_rl.train.rl import RLTrainer

    toy = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
           "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320",
           "warmup.episodes=0", "model.corpus_episodes=4", "algo.tasks_per_step=2", "algo.group_size=2",
           "rollout.max_new_tokens=6", "schedule.horizons=[2]", "train.steps=1", "train.validate_every=0",
           "optim.micro_batch_size=2", "env.spawn_servers=1", "rollout.episode_retries=2",
           f"run.output_dir={tmp_path}"]
    configs = Path(__file__).resolve().parent.parent / "configs"
    trainer = RLTrainer(load_config(RLConfig, configs / "textcraft_grpo.yaml", toy), log=lambda _: None)
    process = trainer.servers._processes[0]
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "textcraft_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env/server_restarts"] == 0 and rows[-1]["rollout/retried_episodes"] == 0
    assert rows[-1]["train/errors"] == 0
    assert process.poll() is not None  # stopped with the run
    with pytest.raises(UserError, match="spawn_servers starts the run's own servers"):
        load_config(RLConfig, configs / "textcraft_grpo.yaml", ["env.spawn_servers=1", "env.urls=[http://x:1]"])


def test_a_run_stopped_by_sigterm_stops_the_servers_it_spawned(tmp_path):
    """SIGTERM (a scheduler's preemption, `timeout`, `compare --jobs` stopping its runs) ends a
    run through its cleanup: exit code 143, a line saying why, and no env server left behind
    (they run in process groups of their own, which the signal does not reach; a run killed
    outright left them listening)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from test_env_e2e import TINY_RUN

    config = Path(__file__).resolve().parent.parent / "configs" / "babyai_grpo.yaml"
    command = [sys.executable, "-m", "agentgym_rl.cli", "train", str(config), *TINY_RUN, "train.steps=10000",
               "train.validate_every=0", "env.spawn_servers=1", f"run.output_dir={tmp_path}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:  # the first step's line: its server is up and playing
            if line.startswith("step 1/"):
                break
        children = [pid for task in Path(f"/proc/{process.pid}/task").iterdir()
                    for pid in (task / "children").read_text().split()]  # started by any of its threads
        servers = [int(pid) for pid in children
                   if b"serve-env" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(servers) == 1
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143 and "stopped: SIGTERM received" in stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(servers[0], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(servers[0], signal.SIGKILL)
        pytest.fail("the env server outlived the run")


def test_a_server_that_went_away_is_passed_over_for_the_healthy_one(counter_env_registered):
    """Of two servers the run did not start, one stops: the episodes it took fail once and are
    played again on the other (rollout.episode_retries 1), and no later episode is sent to it
    until it answers its /health probe. Without the failover, a retry would go to the dead
    server in turn, and some episodes would fail twice."""
    from conftest import CounterExpert

    from agentgym_rl.envs.tasks import Task

    with serving("counter") as steady:
        with serving("counter") as doomed:
            make_env = registry.env_factory("counter", urls=[steady, doomed])
        tasks = [Task("counter", i, "c") for i in range(4)]
        with RolloutEngine(make_env, RolloutConfig(episode_retries=1)) as engine:
            played = engine.run(tasks, CounterExpert(), max_turns=5, samples=2)
            assert all(t.error is None and t.success for t in played) and len(played) == 8
            assert engine.retried == 4  # the 8 episodes started at once took each server in turn


def test_check_env_passes_for_a_mix_in_process_and_through_http():
    """A mix snapshots the member playing (the check_env snapshot rules), here and over HTTP."""
    members = {"members": [{"id": "babyai"}, {"id": "textcraft"}]}
    for item in ("babyai_3", "textcraft_3"):
        check_env(registry.make("mix", **members), item_id=item)
    with serving("mix", env_kwargs=members) as url:
        check_env(HttpEnv(url), item_id="textcraft_3")
