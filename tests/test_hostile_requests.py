"""Hostile and careless requests to every HTTP server of the project (`serve-env`, `serve-model`,
`serve-retriever`, `view`): each gets a 4xx with a reason, never a 5xx, and an error never
quotes more than an excerpt of what was sent.

The fuzzer is ours, seeded and in process: for each route of an app it sends bodies built from a
valid one by breaking it (bad JSON, non-UTF-8 bytes under several content types, a number that
overflows to infinity, lone surrogate escapes, wrong types, huge and negative numbers, deep
nesting, unknown ids in the path) — the inputs that made these servers answer 500 before."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient
from conftest import CORPUS
from test_cli import run
from test_server import free_port, wait_until_healthy

from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.tiny import TinyModelConfig, build_tiny
from agentgym_rl.http_guards import EXCERPT_CHARS
from agentgym_rl.server.app import create_app
from agentgym_rl.server.model_server import create_model_app
from agentgym_rl.server.retriever import create_retriever_app
from agentgym_rl.ui.app import create_app as create_viewer

REQUESTS_PER_APP = 1000

# Values that break a field: wrong types, numbers JSON cannot hold, text that is not Unicode.
BAD_VALUES = [None, True, -1, 0, 2**70, -(2**70), 1.5, "", "x" * 3000, "\ud800", "a\udfffb", [], [1, "a"], {},
              {"a": {"b": [None]}}, "../../etc/passwd", "http://203.0.113.1:9/", "1e309", "NaN"]
RAW_NUMBERS = ["1e309", "-1e309", "NaN", "Infinity", "1e-320", "123456789012345678901234567890"]


def _raw_json(body: dict, rng: random.Random) -> bytes:
    """`body` as JSON with one value replaced by a raw token json.dumps would not write."""
    key = rng.choice(list(body) or ["x"])
    text = json.dumps({**body, key: "@@"}).replace('"@@"', rng.choice(RAW_NUMBERS + ['"\\ud800"', '"\\udc00x"']))
    return text.encode()


def hostile_request(rng: random.Random, body: dict | None) -> dict:
    """httpx request arguments: the route's valid `body`, broken one of several ways."""
    kind = rng.randrange(9)
    if kind == 0 or body is None:
        return {"content": rng.choice([b"{", b"[1,", b"\xff\xfe\x00{", b"null", b"{}" * 500, b"[" * 5000 + b"]" * 5000,
                                       rng.randbytes(rng.randrange(1, 300))]),
                "headers": {"content-type": rng.choice(["application/json", "text/plain",
                                                        "application/x-www-form-urlencoded", "multipart/form-data"])}}
    if kind == 1:
        return {"content": _raw_json(body, rng), "headers": {"content-type": "application/json"}}
    if kind == 2:  # the valid body, sent as something else
        return {"content": json.dumps(body).encode("utf-16"), "headers": {
            "content-type": rng.choice(["text/plain", "application/x-www-form-urlencoded", "application/json"])}}
    broken = dict(body)
    for key in rng.sample(list(body), k=min(len(body), rng.randrange(1, 3))) if body else []:
        broken[key] = rng.choice(BAD_VALUES)
    if kind == 3:
        broken[rng.choice(["extra", "\ud800", "x" * 500])] = rng.choice(BAD_VALUES)
    # ensure_ascii: a lone surrogate travels as its escape, as a client in another language sends it
    return {"content": json.dumps(broken if kind != 4 else [broken], ensure_ascii=True).encode(),
            "headers": {"content-type": "application/json"}}


def fuzz(client: TestClient, routes: list[tuple[str, str, dict | None]], seed: int, count: int) -> list[str]:
    """Send `count` hostile requests over `routes` ((method, path, valid body)); path pieces
    "{id}" get live, unknown and malformed ids. Returns a line per 5xx or overlong error."""
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        method, path, body = rng.choice(routes)
        path = path.replace("{id}", str(rng.choice([1, 2, 0, -1, 10**30, "abc", "1e309", "%F0%9F", "1;2"])))
        kwargs = hostile_request(rng, body) if method in ("POST", "PUT") else {}
        if method == "GET" and rng.random() < 0.5:
            kwargs["params"] = {rng.choice(["step", "line", "split", "offset", "limit", "success"]):
                                rng.choice(["-1", "1e309", "x", "\x00", "9" * 40, "true"])}
        response = client.request(method, path, **kwargs)
        if response.status_code >= 500:
            problems.append(f"{response.status_code} {method} {path} {str(kwargs)[:200]}: {response.text[:200]}")
        elif response.status_code >= 400 and len(response.content) > 20 * EXCERPT_CHARS + 2000:
            problems.append(f"{method} {path}: a {len(response.content)}-byte error answer (echoes the input?)")
    return problems


TINY = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, max_positions=256)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny(CORPUS * 3, tmp_path_factory.mktemp("hostile") / "model", TINY)


@pytest.fixture(scope="module")
def loaded(model_dir):
    model, tokenizer = load_model_and_tokenizer(model_dir)
    return model.eval(), tokenizer


ENV_ROUTES = [("GET", "/health", None), ("GET", "/v1/status", None), ("GET", "/v1/info", None),
              ("POST", "/v1/envs", None), ("POST", "/v1/envs/{id}/reset", {"item_id": 3, "seed": 1}),
              ("POST", "/v1/envs/{id}/step", {"action": "go forward"}), ("GET", "/v1/envs/{id}/available_actions", None),
              ("GET", "/v1/envs/{id}/expert_action", None), ("DELETE", "/v1/envs/{id}", None),
              ("POST", "/create", None), ("POST", "/reset", {"id": 1, "data_idx": 2}),
              ("POST", "/step", {"id": 1, "action": "turn left"}), ("GET", "/observation?id={id}", None)]


def test_the_env_server_answers_hostile_requests_with_4xx():
    app = create_app("babyai", max_instances=32)
    client = TestClient(app)
    for _ in range(2):  # live instances 1 and 2, one reset
        client.post("/v1/envs")
    client.post("/v1/envs/1/reset", json={"item_id": 1})
    assert fuzz(client, ENV_ROUTES, seed=1, count=REQUESTS_PER_APP) == []


def test_the_model_server_answers_hostile_requests_with_4xx(loaded):
    model, tokenizer = loaded
    client = TestClient(create_model_app(model, tokenizer, "tiny"))
    routes = [("GET", "/health", None), ("GET", "/v1/models", None),
              ("POST", "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 1.0, "logprobs": 1,
                                           "stop_token_ids": [3], "return_tokens_as_token_ids": True}),
              ("POST", "/v1/completions", {"prompt": "Counter value", "max_tokens": 1, "temperature": 0.0}),
              ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                "temperature": 0.7})]
    assert fuzz(client, routes, seed=2, count=REQUESTS_PER_APP) == []


def test_the_retriever_answers_hostile_requests_with_4xx():
    from agentgym_rl.envs.search.env import local_retriever

    index = local_retriever((200, 0))
    client = TestClient(create_retriever_app(index, len(index.docs)))
    routes = [("GET", "/health", None), ("POST", "/retrieve", {"queries": ["capital of Vapax"], "topk": 2,
                                                               "return_scores": True})]
    assert fuzz(client, routes, seed=3, count=REQUESTS_PER_APP) == []


def small_run(runs: Path, name: str = "demo") -> Path:
    """A run folder as the viewer reads it: a config, a metrics line, one trajectory."""
    run = runs / name
    (run / "trajectories").mkdir(parents=True)
    (run / "config.yaml").write_text("env: {id: babyai}\nalgo: {name: grpo}\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "train/success": 0.5}\n')
    episode = {"env_id": "babyai", "item_id": "babyai_1", "messages": [], "success": True, "reward": 1.0,
               "turn_rewards": [1.0]}
    (run / "trajectories" / "step_000001.jsonl").write_text(json.dumps(episode) + "\n")
    return run


def test_the_viewer_answers_hostile_requests_with_4xx(tmp_path):
    small_run(tmp_path)
    client = TestClient(create_viewer(tmp_path, allowed_hosts=["testserver"]))
    routes = [("GET", "/api/runs", None), ("GET", "/api/runs/{id}", None), ("GET", "/api/runs/demo/trajectories", None),
              ("GET", "/api/runs/demo/trajectory?split=trajectories&step={id}&line=0", None),
              ("GET", "/api/envs", None), ("GET", "/api/envs/{id}/tasks", None),
              ("POST", "/api/play", {"env_id": "babyai", "item_id": 1, "kwargs": {}}),
              ("POST", "/api/play/{id}/step", {"action": "turn left"}),
              ("POST", "/api/play/{id}/model", {"endpoint": "http://127.0.0.1:9/v1", "model": "m"}),
              ("DELETE", "/api/play/{id}", None)]
    assert fuzz(client, routes, seed=4, count=REQUESTS_PER_APP) == []


def _peak_rss_kib(pid: int) -> int:
    """The process's resident-memory high-water mark (a body buffered whole and freed shows here)."""
    return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmHWM:")).split()[1])


def test_a_chunked_300_mb_body_is_refused_without_being_read_whole():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "agentgym_rl.cli", "serve-env", "babyai", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server)
        httpx.post(f"{url}/v1/envs/1/step", json={"action": "warm up"})  # the first request's allocations
        before = _peak_rss_kib(server.pid)
        sent = 0

        def chunks():  # no Content-Length: the server learns the size only by reading
            nonlocal sent
            block = b'{"action": "' + b"x" * (1 << 20)
            for _ in range(300):
                sent += len(block)
                yield block

        try:
            answer = httpx.post(f"{url}/v1/envs/1/step", content=chunks(), timeout=60)
            assert answer.status_code == 413 and len(answer.content) < 200
        except httpx.TransportError:  # the server hung up before all was sent: refused as well
            pass
        grew = _peak_rss_kib(server.pid) - before
        assert grew < 20 * 1024, f"the server grew by {grew} KiB after {sent} bytes were sent"
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}  # and goes on serving
    finally:
        server.terminate()
        server.wait(10)


def test_a_malformed_body_is_answered_with_an_excerpt_not_an_echo():
    client = TestClient(create_app("babyai"))
    client.post("/v1/envs")
    answer = client.post("/v1/envs/1/reset", content=json.dumps({"item_id": ["x" * 900_000]}),
                         headers={"content-type": "application/json"})
    assert answer.status_code == 422 and len(answer.content) < 2000
    for path, field in (("reset", "item_id"), ("step", "action")):
        for value in (b"1e309", b'"\\ud800"', b'"a\\udc00"'):
            for kind in ("application/json", "text/plain"):
                answer = client.post(f"/v1/envs/1/{path}", content=b'{"%s": %s}' % (field.encode(), value),
                                     headers={"content-type": kind})
                assert answer.status_code == 422, (path, value, kind, answer.text)
        answer = client.post(f"/v1/envs/1/{path}", content=b"\xff\xfe", headers={"content-type": "text/plain"})
        assert answer.status_code == 422, answer.text


def test_a_token_guards_every_route_of_the_model_server_but_a_bare_health(loaded):
    model, tokenizer = loaded
    client = TestClient(create_model_app(model, tokenizer, "tiny", token="s3cret"))
    assert client.get("/health").json() == {"status": "ok"}  # alive, and nothing more
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/docs"), ("GET", "/openapi.json")]:
        assert client.request(method, path, json={}).status_code == 401, path
    bearer = {"authorization": "Bearer s3cret"}
    assert client.get("/v1/models", headers=bearer).json()["data"][0]["id"] == "tiny"


def test_the_model_server_refuses_what_it_cannot_sample(loaded):
    model, tokenizer = loaded
    client = TestClient(create_model_app(model, tokenizer, "tiny"))
    context = model.config.max_position_embeddings
    too_long = client.post("/v1/completions", json={"prompt": [5] * context, "max_tokens": 1})
    assert too_long.status_code == 422 and f"context of {context} tokens" in too_long.text
    bad_stop = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 1, "stop_token_ids": [10**30]})
    assert bad_stop.status_code == 422 and "stop_token_ids" in bad_stop.text
    infinite = client.post("/v1/completions", content=b'{"prompt": [5], "temperature": 1e309}',
                           headers={"content-type": "application/json"})
    assert infinite.status_code == 422 and "temperature" in infinite.text
    tiny = client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 3, "temperature": 1e-320})
    greedy = client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 3, "temperature": 0})
    assert tiny.status_code == 200 and tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


@pytest.mark.slow
def test_serve_model_stops_within_seconds_of_sigterm_during_a_long_generation(tmp_path):
    # A context long enough for the request below (the module's tiny model holds 256 tokens, so
    # it would refuse it with a 422 at once, and nothing would be in flight).
    model_dir = build_tiny(CORPUS * 3, tmp_path / "model", dataclasses.replace(
        TINY, max_positions=8192, hidden_size=128, intermediate_size=256, num_layers=2))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "agentgym_rl.cli", "serve-model", str(model_dir), "--port",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server)
        import threading

        # 64 prompts of 4,000 new tokens without a stop token: minutes of work on this model.
        answers = []
        long = threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/v1/completions", timeout=120, json={
            "prompt": [[5, 6, 7]] * 64, "max_tokens": 4000, "stop_token_ids": [300], "temperature": 1.0})),
            daemon=True)
        long.start()
        time.sleep(2)
        assert server.poll() is None
        asked = time.monotonic()
        server.terminate()
        server.wait(10)  # raises TimeoutExpired when it does not stop within 10 s
        assert time.monotonic() - asked < 10
        long.join(5)
        # The request in flight is told the server is going (503), not cut off with a 500.
        assert answers and answers[0].status_code == 503 and "shutting down" in answers[0].text, answers[0].text
        assert b"CancelledError" not in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_port_in_use_is_a_one_line_error(model_dir):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in (["serve-env", "babyai"], ["view", str(model_dir)]):
            result = run(*command, "--port", str(port))  # in this process: what a process prints
            assert result.returncode == 2, result.stderr
            assert result.stderr.strip().startswith("error: cannot listen on 127.0.0.1:") \
                and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_viewer_serves_nothing_through_a_link_out_of_the_runs_folder(tmp_path):
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    run = small_run(runs)
    (outside / "validation").mkdir(parents=True)
    secret = outside / "secret.jsonl"
    secret.write_text('{"env_id": "SECRET", "item_id": "x"}\n')
    (outside / "validation" / "step_000001.jsonl").write_text('{"env_id": "SECRET"}\n')
    (outside / "config.yaml").write_text("env: {id: SECRET}\n")
    (run / "trajectories" / "step_000002.jsonl").symlink_to(secret)
    (run / "validation").symlink_to(outside / "validation")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(secret)
    other = small_run(runs, "other")
    (other / "config.yaml").unlink()
    (other / "config.yaml").symlink_to(outside / "config.yaml")
    client = TestClient(create_viewer(runs, allowed_hosts=["testserver"]))
    answers = [client.get("/api/runs"), client.get("/api/runs/demo"), client.get("/api/runs/other"),
               client.get("/api/runs/demo/trajectories"),
               client.get("/api/runs/demo/trajectory", params={"split": "trajectories", "step": 2, "line": 0}),
               client.get("/api/runs/demo/trajectory", params={"split": "validation", "step": 1, "line": 0})]
    assert all("SECRET" not in answer.text for answer in answers)
    assert [run["name"] for run in answers[0].json()["runs"]] == ["demo"]
    assert answers[2].status_code == 404 and answers[4].status_code == 404 and answers[5].status_code == 404
    assert answers[3].json()["total"] == 1  # the run's own trajectory file is still served
    assert "links out of the run folder" in answers[1].json()["problems"][0]


def test_the_viewer_answers_an_overlong_run_name_with_404(tmp_path):
    client = TestClient(create_viewer(tmp_path, allowed_hosts=["testserver"]))
    for name in ("x" * 300, "a/" + "y" * 4000):
        for path in (f"/api/runs/{name}", f"/api/runs/{name}/trajectories"):
            assert client.get(path).status_code == 404


def test_the_viewer_refuses_a_foreign_host():
    client = TestClient(create_viewer(Path("."), allowed_hosts=["localhost", "127.0.0.1"]))
    assert client.get("/api/envs", headers={"host": "localhost:8080"}).status_code == 200
    refused = client.get("/api/envs", headers={"host": "attacker.example"})
    assert refused.status_code == 400 and "--allow-host" in refused.text
    assert client.get("/", headers={"host": "attacker.example:8080"}).status_code == 400


@pytest.mark.parametrize("command", ["serve-env babyai", "serve-model {model}", "serve-retriever", "view {runs}"])
def test_every_server_command_refuses_a_foreign_host(command, model_dir, tmp_path, monkeypatch):
    """Each server as its command builds it (`_serve` captured, nothing listens) answers the
    loopback names, its bound address and --allow-host names, and 400 to any other `Host`."""
    import agentgym_rl.cli

    served = {}
    monkeypatch.setattr(agentgym_rl.cli, "_serve", lambda app, host, port, *args, **kwargs: served.update(app=app))
    words = command.format(model=model_dir, runs=tmp_path).split()
    result = run(*words, "--host", "127.0.0.2", "--allow-host", "trainer.lan")
    assert result.returncode == 0, result.stderr
    client = TestClient(served["app"])
    for name in ("localhost:8000", "127.0.0.1", "[::1]:9", "127.0.0.2:8000", "trainer.lan"):
        path = "/health" if command != "view {runs}" else "/api/envs"
        assert client.get(path, headers={"host": name}).status_code == 200
    refused = client.get("/health", headers={"host": "attacker.example"})
    assert refused.status_code == 400 and "--allow-host" in refused.text


def test_a_server_bound_off_loopback_says_so(monkeypatch):
    monkeypatch.setattr("uvicorn.Server.run", lambda self, sockets: None)
    result = run("serve-env", "babyai", "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 0 and "other machines" in result.stderr and "--token" in result.stderr
    assert "other machines" not in run("serve-env", "babyai", "--port", "0").stderr


def test_the_playground_fetches_no_url_it_was_not_given(tmp_path):
    import socket

    with socket.socket() as listener:  # a server on a loopback address that is not the viewer's own name
        listener.bind(("127.0.0.2", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        client = TestClient(create_viewer(tmp_path, allowed_hosts=["testserver"]))
        played = client.post("/api/play", json={"env_id": "babyai", "item_id": 0, "url": f"http://127.0.0.2:{port}"})
        assert played.status_code == 403 and "--allow-url" in played.text
        session = client.post("/api/play", json={"env_id": "babyai", "item_id": 0}).json()["session"]
        asked = client.post(f"/api/play/{session}/model", json={"endpoint": f"http://127.0.0.2:{port}/v1"})
        assert asked.status_code == 403
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody called
        called = []

        def hang_up() -> None:
            connection, _ = listener.accept()
            called.append(connection.recv(100))
            connection.close()

        import threading

        listener.settimeout(10)
        answering = threading.Thread(target=hang_up)
        answering.start()
        allowed = TestClient(create_viewer(tmp_path, allowed_hosts=["testserver"],
                                           allowed_urls=[f"http://127.0.0.2:{port}"]))
        tried = allowed.post("/api/play", json={"env_id": "babyai", "item_id": 0, "url": f"http://127.0.0.2:{port}"})
        answering.join(10)
        assert tried.status_code == 422 and called  # given on the command line: asked (it hung up)
