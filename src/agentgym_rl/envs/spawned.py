"""Environment servers a run starts for itself (`env.spawn_servers`), and keeps alive.

Each is an `agentgym-rl serve-env` process on a loopback port, with a random bearer token only
this process knows. A watchdog thread probes every server's process and `GET /health`; one that
exited or stopped answering is killed and started again on its port, and counted (`restarts`).
Its episodes in flight fail in their environment; with `rollout.episode_retries` the rollout
engine plays them again, on this server once it is back or on another, so a step's groups stay
whole.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable

import httpx
import yaml

from ..errors import UserError
from .base import TextEnv

START_SECONDS = 120.0
"""How long a server may take to answer /health after it is started (imports, its environment)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SpawnedServers:
    """`count` servers of `env_id` (built with `kwargs`) in processes of their own, watched.

    Args:
        env_id: a registered environment.
        kwargs: its constructor arguments (`env.kwargs`), given to every server.
        count: how many servers.
        probe_every: seconds between two rounds of health probes.
        unanswered: seconds a server may fail its probes before it is restarted.
        log: where restarts are reported.
        snapshot_key: the key every server (and every restart) signs snapshots with, so that any
            of them restores what another handed out (default: a random one for this object).
    """

    def __init__(self, env_id: str, kwargs: dict[str, Any], count: int, probe_every: float = 1.0,
                 unanswered: float = 10.0, log: Callable[[str], Any] = print, snapshot_key: bytes | None = None):
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.env_id, self.kwargs, self.log = env_id, dict(kwargs), log
        self.token = secrets.token_urlsafe(24)
        self.snapshot_key = snapshot_key or secrets.token_bytes(32)
        self.ports = [_free_port() for _ in range(count)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.restarts = 0
        self._processes: list[subprocess.Popen] = [None] * count  # type: ignore[list-item]
        self._logs: list[Any] = [None] * count
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._probe_every, self._unanswered = probe_every, unanswered
        # The servers stop with `close()`, or else when the interpreter exits.
        self._finalizer = weakref.finalize(self, _kill_all, self._processes)
        for index in range(count):
            self._start(index)
        for index in range(count):
            self._wait_healthy(index)
        self._watchdog = threading.Thread(target=self._watch, name="env-server-watchdog", daemon=True)
        self._watchdog.start()

    # -------------------------------------------------------------------------- servers
    def _command(self, index: int) -> list[str]:
        args = [sys.executable, "-m", "agentgym_rl.cli", "serve-env", self.env_id, "--port", str(self.ports[index])]
        for key, value in self.kwargs.items():  # as YAML on one line, which --env-arg reads back
            flow = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            args += ["--env-arg", f"{key}={flow}"]
        return args

    def _start(self, index: int) -> None:
        environment = {**os.environ, "AGENTGYM_RL_ENV_TOKEN": self.token,
                       "AGENTGYM_RL_SNAPSHOT_KEY": self.snapshot_key.hex()}
        # Its log goes to a file, not a pipe nobody reads (a full pipe would stall the server).
        self._logs[index] = tempfile.TemporaryFile()
        self._processes[index] = subprocess.Popen(self._command(index), env=environment, stdout=self._logs[index],
                                                  stderr=subprocess.STDOUT, start_new_session=True)

    def _healthy(self, index: int) -> bool:
        try:
            return httpx.get(f"{self.urls[index]}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _wait_healthy(self, index: int) -> None:
        deadline = time.monotonic() + START_SECONDS
        process = self._processes[index]
        while not self._healthy(index):
            if process.poll() is not None:
                self._logs[index].seek(0)
                error = self._logs[index].read().decode(errors="replace")[-1500:]
                self.close()
                raise UserError(f"the {self.env_id} server on port {self.ports[index]} exited at start: {error}")
            if time.monotonic() > deadline:
                self.close()
                raise UserError(f"the {self.env_id} server on port {self.ports[index]} did not answer /health "
                                f"within {START_SECONDS:g} s")
            time.sleep(0.1)

    def restart(self, index: int, why: str) -> None:
        """Kill server `index` (if it still runs) and start it again on its port."""
        with self._lock:
            _kill(self._processes[index])
            self._start(index)
            self.restarts += 1
        self.log(f"env server {self.urls[index]} {why}: restarted it ({self.restarts} restart(s) so far)")
        self._wait_healthy(index)

    def _watch(self) -> None:
        silent_since: dict[int, float] = {}
        while not self._stop.wait(self._probe_every):
            for index, process in enumerate(list(self._processes)):
                if self._stop.is_set():
                    return
                try:
                    if process.poll() is not None:
                        self.restart(index, f"exited ({process.returncode})")
                    elif self._healthy(index):
                        silent_since.pop(index, None)
                    elif time.monotonic() - silent_since.setdefault(index, time.monotonic()) > self._unanswered:
                        silent_since.pop(index, None)
                        self.restart(index, f"did not answer /health for {self._unanswered:g} s")
                except UserError as error:  # it would not start again: the run's episodes on it fail
                    self.log(f"warning: {error}")
                    return

    def pid(self, index: int) -> int:
        return self._processes[index].pid

    # -------------------------------------------------------------------------- clients
    def factory(self, timeout: float = 60.0) -> Callable[[], TextEnv]:
        """Builds clients of the servers in turn (`HttpEnv`s with this run's token), passing over
        one that is down while the watchdog restarts it (`remote.in_turn`)."""
        from .remote import EnvServer, HttpEnv, in_turn

        servers = [EnvServer(url, token=self.token, timeout=timeout) for url in self.urls]
        return in_turn([(server, lambda server=server: HttpEnv(server)) for server in servers])

    def close(self) -> None:
        """Stop watching and stop every server (safe to call more than once)."""
        self._stop.set()
        self._finalizer()


def _kill(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the server and anything it started
    except ProcessLookupError:
        pass
    process.wait(10)


def _kill_all(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        _kill(process)
