"""The web environment's costs: memory per env instance, resets/s and steps/s, for env
instances that share one Chromium (a browser context each, the default) and for instances
with a Chromium process of their own (`own_browser=True`).

    python bench/web_env.py [--instances 8] [--episodes 30]

Memory is the proportional set size (PSS, shared pages split between their processes) of all
Chromium processes under this one, each instance having opened its first task's page. Resets
and steps are timed on the embedded shop's test tasks, played by the expert: one env in a
loop, then `--threads` envs stepped from as many threads, as a rollout does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvExpert
from agentgym_rl.envs.web.browser import chromium_pids


def chromium_pss_mib() -> float:
    """Total PSS of the Chromium processes descending from this process, in MiB."""
    total_kib = 0
    for pid in chromium_pids():
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total_kib += int(next(line for line in rollup.splitlines() if line.startswith("Pss:")).split()[1])
    return total_kib / 1024


def memory(instances: int, own_browser: bool) -> tuple[float, float]:
    """(PSS with one instance, PSS with `instances`), in MiB, above what Chromium held before
    (a shared browser left idle by an earlier measurement)."""
    before = chromium_pss_mib()
    envs = [registry.make("web", own_browser=own_browser) for _ in range(instances)]
    try:
        envs[0].reset(0)
        time.sleep(1)
        one = chromium_pss_mib() - before
        for env in envs[1:]:
            env.reset(0)
        time.sleep(1)
        return one, chromium_pss_mib() - before
    finally:
        for env in envs:
            env.close()


def play(env, items: list[int]) -> tuple[int, int, float, float]:
    """(resets, steps, seconds in reset, seconds in step) of expert episodes on `items`."""
    expert = EnvExpert()
    steps, reset_time, step_time = 0, 0.0, 0.0
    for item in items:
        began = time.perf_counter()
        env.reset(item)
        reset_time += time.perf_counter() - began
        while True:
            action = expert.act(env)
            began = time.perf_counter()
            terminated = env.step(action)[2]
            step_time += time.perf_counter() - began
            steps += 1
            if terminated:
                break
    return len(items), steps, reset_time, step_time


def measure(own: bool, instances: int, episodes: int, threads: int) -> dict[str, str]:
    """The table's column for one way of giving env instances a browser."""
    items = [task.index for task in registry.tasks("web", "test")][:episodes]
    column = {}
    one, many = memory(instances, own)
    column["Chromium memory (PSS), 1 instance"] = f"{one:.0f} MiB"
    column[f"Chromium memory (PSS), {instances} instances"] = f"{many:.0f} MiB"
    column["memory per extra instance"] = f"{(many - one) / (instances - 1):.0f} MiB"
    with registry.make("web", own_browser=own) as env:
        play(env, items[:2])  # launch and warm up
        resets, steps, reset_time, step_time = play(env, items)
    column["resets/s, one env"] = f"{resets / reset_time:.1f}"
    column["steps/s, one env (expert actions)"] = f"{steps / step_time:.1f}"
    column["episodes/s, one env"] = f"{resets / (reset_time + step_time):.2f}"
    envs = [registry.make("web", own_browser=own) for _ in range(threads)]
    try:
        shares = [items[i::threads] for i in range(threads)]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda pair: play(*pair), [(env, items[:1]) for env in envs]))  # warm up
            began = time.perf_counter()
            results = list(pool.map(lambda pair: play(*pair), zip(envs, shares)))
            wall = time.perf_counter() - began
    finally:
        for env in envs:
            env.close()
    column[f"episodes/s, {threads} envs on {threads} threads"] = f"{sum(r[0] for r in results) / wall:.2f}"
    column[f"steps/s (resets included), {threads} envs"] = f"{sum(r[1] for r in results) / wall:.1f}"
    return column


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--mode", choices=["shared", "own"], help="measure one mode and print it as JSON")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode == "own", args.instances, args.episodes, args.threads)))
        return
    columns = []
    for mode in ("shared", "own"):  # each in a fresh process: no browser of the other mode shares its pages
        result = subprocess.run([sys.executable, __file__, "--mode", mode, "--instances", str(args.instances),
                                 "--episodes", str(args.episodes), "--threads", str(args.threads)],
                                capture_output=True, text=True, check=True)
        columns.append(json.loads(result.stdout.strip().splitlines()[-1]))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| what | shared browser, a context per instance | a browser per instance |\n|---|---|---|")
    for what in columns[0]:
        print(f"| {what} | {columns[0][what]} | {columns[1][what]} |")


if __name__ == "__main__":
    main()
