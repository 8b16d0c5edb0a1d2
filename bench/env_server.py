"""Environments over HTTP against in process, and what reusing an environment saves.

    python bench/env_server.py [--instances 64] [--episodes 256] [--sciworld-items 6]

1. BabyAI steps/s with `--instances` environments alive at once, played by the rollout engine
   with a policy that costs nothing (a fixed cycle of moves), in this process and through an
   `agentgym-rl serve-env babyai` server started as its own process on loopback. Best of three
   timed runs each, after a warm-up run.
2. SciWorld reset time: a new environment per episode (a JVM started, the task loaded, the
   first look) against one environment reset again (the JVM reused), on the first test items.

Run alone on the machine (the server and this client share its cores); copy the printed
table into docs/BENCHMARKS.md with the date.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

import httpx

from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import make, registry
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.rollout.policy import TextPolicy

MOVES = ("turn left", "move forward", "turn right", "move forward", "move forward")


class Wandering(TextPolicy):
    """A fixed cycle of moves (some episodes end early, at a wall or by luck)."""

    def __init__(self) -> None:
        self.turn = 0

    def reply(self, env) -> str:
        self.turn += 1
        return f"Action: {MOVES[self.turn % len(MOVES)]}"


def steps_per_second(make_env, instances: int, episodes: int, repeats: int = 3) -> tuple[float, int]:
    """(best env steps/s over `repeats` timed runs, steps per run) of `episodes` BabyAI episodes."""
    tasks = registry.tasks("babyai", "train")[:episodes]
    config = RolloutConfig(max_envs=instances)  # otherwise the defaults, in process and through HTTP
    best, steps = 0.0, 0
    with RolloutEngine(make_env, config) as engine:
        engine.run(tasks[:instances], Wandering(), max_turns=20)  # warm-up: the environments are made
        for _ in range(repeats):
            began = time.perf_counter()
            trajectories = engine.run(tasks, Wandering(), max_turns=20)
            elapsed = time.perf_counter() - began
            errors = [t.error for t in trajectories if t.error]
            if errors:
                raise RuntimeError(f"{len(errors)} episodes failed, e.g. {errors[0]}")
            steps = sum(t.turns for t in trajectories)
            best = max(best, steps / elapsed)
    return best, steps


def serve(env_id: str, port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "agentgym_rl.cli", "serve-env", env_id, "--port", str(port),
                               "--max-instances", "1024"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health").raise_for_status()
            return server
        except httpx.HTTPError:
            if server.poll() is not None:
                raise RuntimeError(f"serve-env exited: {server.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("serve-env did not start within 60 s")


def sciworld_resets(items: int) -> tuple[list[float], list[float]]:
    """Seconds per reset: a new environment each time, then one environment reset again."""
    indices = [task.index for task in registry.tasks("sciworld", "test")[:items]]
    fresh = []
    for index in indices:
        began = time.perf_counter()
        env = make("sciworld")
        env.reset(index)
        fresh.append(time.perf_counter() - began)
        env.close()
    env = make("sciworld")
    env.reset(indices[-1])  # the JVM is up: what follows is reuse
    reused = []
    for index in indices:
        began = time.perf_counter()
        env.reset(index)
        reused.append(time.perf_counter() - began)
    env.close()
    return fresh, reused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--sciworld-items", type=int, default=6)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    rows = []

    local, steps = steps_per_second(registry.env_factory("babyai"), args.instances, args.episodes)
    rows.append((f"BabyAI in process, {args.instances} envs alive, {args.episodes} episodes ({steps} steps)",
                 f"{local:.0f} steps/s"))
    server = serve("babyai", args.port)
    try:
        url = f"http://127.0.0.1:{args.port}"
        remote, steps = steps_per_second(registry.env_factory("babyai", urls=[url]), args.instances, args.episodes)
    finally:
        server.terminate()
        server.wait(10)
    rows.append((f"BabyAI through serve-env (own process, loopback), {args.instances} envs alive",
                 f"{remote:.0f} steps/s ({remote / local:.2f}× in process)"))

    if args.sciworld_items:
        fresh, reused = sciworld_resets(args.sciworld_items)
        for name, times in (("a new environment each episode (JVM start + load + look)", fresh),
                            ("the same environment reset again (JVM reused)", reused)):
            rows.append((f"SciWorld reset, {name}, {len(times)} test items",
                         f"{statistics.mean(times):.2f} s mean ({min(times):.2f}-{max(times):.2f})"))

    print(f"machine: {platform.machine()}, {platform.python_version()}")
    print("| what | measured |\n|---|---|")
    for what, figure in rows:
        print(f"| {what} | {figure} |")


if __name__ == "__main__":
    main()
