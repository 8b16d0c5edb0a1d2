"""The viewer's playground runs no program, reads no file and fetches no URL that a request
names: a request sets only an environment's listed safe arguments (`EnvSpec.safe_kwargs`), talks
only to servers given with `--allow-url` (this machine's too), and no error echoes what a remote
server answered."""

from __future__ import annotations

import inspect
import json
import socket
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_cli import cli

from agentgym_rl.envs import registry
from agentgym_rl.envs.registry import checked_kwargs
from agentgym_rl.envs.safe_kwargs import SafeArg, SafeMembers
from agentgym_rl.errors import UserError
from agentgym_rl.ui.app import create_app


class Listener:
    """A TCP server on loopback that records what each connection sent and answers `reply`."""

    def __init__(self, reply: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"):
        self.reply, self.received = reply, []
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.socket.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                connection, _ = self.socket.accept()
            except (TimeoutError, OSError):
                continue
            with connection:
                connection.settimeout(2)
                try:
                    self.received.append(connection.recv(65536))
                    connection.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.socket.close()


@pytest.fixture
def listener():
    served = Listener()
    yield served
    served.close()


def viewer(tmp_path: Path, **options) -> TestClient:
    return TestClient(create_app(tmp_path, allowed_hosts=["testserver"], **options))


def test_a_request_cannot_name_the_browser_executable(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "fake-chromium.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    played = viewer(tmp_path).post("/api/play", json={"env_id": "web", "item_id": 0,
                                                      "kwargs": {"chromium": str(script)}})
    assert played.status_code == 403 and "chromium" in played.text and "--env-arg" in played.text
    assert not marker.exists()


@pytest.mark.parametrize("env_id, kwargs", [
    ("search", {"retriever_url": "{url}"}),
    ("web", {"judge_url": "{url}/v1"}),
    ("web", {"task_file": "{file}", "site_urls": {"shopping": "{url}"}}),
    ("appworld", {"url": "{url}"}),
    ("mix", {"members": [{"id": "search", "kwargs": {"retriever_url": "{url}"}}]}),
])
def test_a_request_cannot_name_a_url_for_an_environment_to_fetch(tmp_path, listener, monkeypatch, env_id, kwargs):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-SECRET")
    task_file = tmp_path / "tasks.json"
    task_file.write_text(json.dumps([{"task_id": 0, "intent": "x", "start_url": "file:///etc/passwd"}]))
    body = json.loads(json.dumps(kwargs).replace("{url}", listener.url).replace("{file}", str(task_file)))
    client = viewer(tmp_path, allowed_urls=[listener.url])  # even a URL the viewer may use itself
    played = client.post("/api/play", json={"env_id": env_id, "item_id": 0, "kwargs": body})
    assert played.status_code == 403, played.text
    assert listener.received == []


def test_a_request_cannot_make_the_search_env_read_a_file(tmp_path):
    secret = tmp_path / "outside" / "corpus.jsonl"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"id": "0", "contents": "SECRET\nthe key is 42"}) + "\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    client = viewer(runs)
    for kwargs in ({"corpus": str(secret), "qa_dir": str(secret.parent)}, {"encoder": str(secret.parent)},
                   {"world_size": 10**7}):
        played = client.post("/api/play", json={"env_id": "search", "item_id": 0, "kwargs": kwargs})
        assert played.status_code == 403 and "SECRET" not in played.text, played.text


def test_every_constructor_argument_is_refused_unless_listed_safe(tmp_path):
    """Walks every parameter of every registered environment's constructor: one not listed in
    its `safe_kwargs` is refused (so a parameter added later is too); a listed one is a bounded
    bool, number or choice, and is a real parameter."""
    client = viewer(tmp_path)
    for env_id in registry.env_ids():
        spec = registry.spec(env_id)
        parameters = inspect.signature(registry.load_entry_point(spec.entry_point)).parameters
        assert set(spec.safe_kwargs) <= set(parameters), env_id
        for name, allowed in spec.safe_kwargs.items():
            if isinstance(allowed, SafeMembers):
                continue
            assert allowed.kind in (bool, int, float, str), (env_id, name)
            if allowed.kind in (int, float):
                assert allowed.low is not None and allowed.high is not None, (env_id, name)
            if allowed.kind is str:
                assert allowed.choices, (env_id, name)
        for name in set(parameters) - set(spec.safe_kwargs) - {"self"}:
            played = client.post("/api/play", json={"env_id": env_id, "item_id": 0, "kwargs": {name: "x"}})
            assert played.status_code == 403 and repr(name) in played.text, (env_id, name, played.text)


def test_safe_arguments_are_checked_for_type_and_bounds():
    assert SafeArg(int, 1, 20).check("top_k", 3) == 3
    assert SafeArg(str, separator=",", choices=("a", "b")).check("s", "a,b") == "a,b"
    for arg, value in [(SafeArg(bool), 1), (SafeArg(int, 1, 20), 21), (SafeArg(int, 1, 20), True),
                       (SafeArg(int, 1, 20), 2.5), (SafeArg(float, 0.5, 60), float("inf")),
                       (SafeArg(str, choices=("a",)), "../a"), (SafeArg(str, separator=",", choices=("a",)), "a,z")]:
        with pytest.raises(ValueError):
            arg.check("x", value)
    members = checked_kwargs("mix", {"members": [{"id": "babyai", "kwargs": {"list_actions": False}}]},
                             lambda env: {"list_actions": True, "other": 1} if env == "babyai" else {})
    assert members["members"][0]["kwargs"] == {"list_actions": False, "other": 1}  # the command line's, then the page's
    with pytest.raises(ValueError, match="mix"):
        checked_kwargs("mix", {"members": [{"id": "mix"}]})


def test_the_command_lines_arguments_reach_the_playgrounds_environments(tmp_path):
    client = viewer(tmp_path, env_settings={"babyai": {"list_actions": False}})
    quiet = client.post("/api/play", json={"env_id": "babyai", "item_id": 3}).json()
    listed = client.post("/api/play", json={"env_id": "babyai", "item_id": 3, "kwargs": {"list_actions": True}}).json()
    assert "check available actions" not in quiet["messages"][0]["content"]
    assert "check available actions" in listed["messages"][0]["content"]
    envs = {env["id"]: env for env in client.get("/api/envs").json()["envs"]}
    assert envs["babyai"]["settable"] == ["list_actions", "note_unchanged"] and "chromium" not in envs["web"]["settable"]


def test_view_refuses_an_env_arg_without_an_environment(tmp_path):
    code, out, err = cli("view", str(tmp_path), "--env-arg", "chromium=/bin/sh")
    assert code == 2 and "ENV.KEY=VALUE" in err and "Traceback" not in err


def test_a_loopback_port_is_used_only_when_given(tmp_path, listener):
    client = viewer(tmp_path)
    session = client.post("/api/play", json={"env_id": "babyai", "item_id": 0}).json()["session"]
    asked = client.post(f"/api/play/{session}/model", json={"endpoint": f"{listener.url}/v1", "model": "m"})
    played = client.post("/api/play", json={"env_id": "babyai", "item_id": 0, "url": listener.url})
    assert asked.status_code == 403 and played.status_code == 403
    assert listener.received == []


def test_no_error_echoes_what_a_remote_server_answered(tmp_path):
    secret = b"SECRET body of another service"
    answers_of_another_service = [(secret, b"text/plain"), (b'{"note": "SECRET", "env_id": "babyai"}',
                                                            b"application/json")]
    for body, content_type in answers_of_another_service:
        server = Listener(b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        try:
            client = viewer(tmp_path, allowed_urls=[server.url])
            answers = [client.post("/api/play", json={"env_id": "babyai", "item_id": 0, "url": url})
                       for url in (server.url, f"agentgym+{server.url}")]
            session = client.post("/api/play", json={"env_id": "babyai", "item_id": 0}).json()["session"]
            answers.append(client.post(f"/api/play/{session}/model", json={"endpoint": f"{server.url}/v1"}))
        finally:
            server.close()
        for answer in answers:
            assert 400 <= answer.status_code < 500 or answer.status_code == 502, answer.text
            assert "SECRET" not in answer.text and server.received


def test_an_env_server_without_instruction_is_a_one_line_error(tmp_path):
    body = b'{"env_id": "babyai"}'
    server = Listener(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    try:
        with pytest.raises(UserError, match="not an environment server"):
            registry.env_factory("babyai", {}, [server.url], timeout=5.0)
    finally:
        server.close()
