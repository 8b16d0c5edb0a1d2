"""Soak: 2,000 BabyAI episodes through `agentgym-rl serve-env`, each on an instance created
for it and closed after, from 8 client threads. The server's resident memory may grow less
than 10% from after the warm-up to the end, and no instance may outlive its episode."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from test_server import free_port, wait_until_healthy

from agentgym_rl.envs.remote import EnvServer, HttpEnv

EPISODES = 2_000
WARMUP = 500
THREADS = 8
MOVES = ("turn left", "move forward", "toggle")


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def play(server: EnvServer, episode: int) -> None:
    """One short episode on a new instance: reset, two steps (an invalid one among them), close."""
    env = HttpEnv(server)
    try:
        env.reset(episode % 500, seed=episode)
        for turn in range(2):
            _, _, terminated, _, _ = env.step(f"Thought: soak\nAction: {MOVES[(episode + turn) % len(MOVES)]}")
            if terminated:
                break
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc")
def test_thousands_of_episodes_leak_neither_memory_nor_instances():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "agentgym_rl.cli", "serve-env", "babyai", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_healthy(url, process)
        server = EnvServer(url)
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda e: play(server, e), range(WARMUP)))
            after_warmup = resident_kib(process.pid)
            list(pool.map(lambda e: play(server, e), range(WARMUP, EPISODES)))
        at_end = resident_kib(process.pid)
        assert httpx.get(f"{url}/v1/status").json()["instances"] == 0
        growth = at_end / after_warmup - 1
        assert growth < 0.10, f"resident memory grew {growth:.1%} ({after_warmup} -> {at_end} KiB)"
        server.close()
    finally:
        process.terminate()
        process.wait(10)
