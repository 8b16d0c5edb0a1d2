"""How many BabyAI items a policy could solve by naming the right listed action at once, and which
of them a run's validation solved: the headroom of an RL run whose successes all take one turn.

Greedy SmolLM2 runs solve an item with their first reply or never (docs/RESULTS.md): after a
refused or useless action the next observation is the same, so greedy decoding repeats itself
to the turn limit. This script measures, from the environment alone (no model), the items one
listed action solves from the first observation, and those that one turn (left or right)
followed by one listed action solves, per category; each action is tried from a snapshot of
the same state. Given validation files (`runs/<run>/validation/step_*.jsonl` or a
`bench/baselines/*.jsonl.gz`), it adds how many items each solved, and how many of those lie
inside the one-action set.

    python bench/babyai_headroom.py [--split test] [--episodes N] [VALIDATION.jsonl[.gz] ...]

Run by hand, in seconds on a CPU; the table goes into docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from agentgym_rl.envs import registry
from agentgym_rl.errors import UserError
from agentgym_rl.jsonlines import read_json_lines

TURNS = ("turn left", "turn right")


def solving_actions(env, snapshot: bytes) -> list[str]:
    """The listed actions that end the episode with success from the state `snapshot` holds."""
    env.restore(snapshot)
    solving = []
    for action in env.available_actions() or []:
        env.restore(snapshot)
        if env.step(action)[4].get("success"):
            solving.append(action)
    return solving


def headroom(split: str, episodes: int | None) -> list[dict]:
    """One row per item: its id, category, the actions that solve it at once, and whether a turn
    followed by one action does."""
    env = registry.make("babyai")
    rows = []
    try:
        for task in registry.tasks("babyai", split)[:episodes]:
            env.reset(item_id=task.item_id)
            start = env.snapshot()
            at_once = solving_actions(env, start)
            after_turn = False
            if not at_once:
                for turn in TURNS:
                    env.restore(start)
                    env.step(turn)
                    if solving_actions(env, env.snapshot()):
                        after_turn = True
                        break
            rows.append({"item_id": task.item_id, "category": task.category, "at_once": at_once,
                         "after_turn": after_turn})
    finally:
        env.close()
    return rows


def solved_items(path: Path) -> set[str]:
    """The item ids a validation file (JSON lines, gzipped or not) records as solved."""
    return {record["item_id"] for record in read_json_lines(path) if record.get("success")}


def column_labels(paths: list[Path]) -> list[str]:
    """Each path's shortest trailing part that tells it from the others: two runs' validations
    share their file names (`step_000014.jsonl`), so their columns are named from the run folder."""
    depth = 1
    # Ends by the whole paths at the latest: the files are distinct (the table keys on them).
    while len(set(labels := ["/".join(path.parts[-depth:]) for path in paths])) < len(paths):
        depth += 1
    return labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("validations", nargs="*", type=Path, help="validation files to set beside the headroom")
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--episodes", type=int, default=None, help="the split's first N items (default: all)")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.validations if not path.is_file()]
    if missing:
        print(f"error: no such validation file: {', '.join(missing)}", file=sys.stderr)
        return 2

    try:
        solved = {path: solved_items(path) for path in args.validations}
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = headroom(args.split, args.episodes)
    categories = [category for category, _ in collections.Counter(row["category"] for row in rows).most_common()]
    columns = ["category", "items", "one action", "a turn, then one action"] + column_labels(list(solved))
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for category in categories + ["all"]:
        mine = [row for row in rows if category in ("all", row["category"])]
        at_once = {row["item_id"] for row in mine if row["at_once"]}
        cells = [category, str(len(mine)), str(len(at_once)),
                 str(len(at_once) + sum(row["after_turn"] for row in mine))]
        for items in solved.values():
            in_category = items & {row["item_id"] for row in mine}
            cells.append(f"{len(in_category)} ({len(in_category & at_once)} of them one-action)")
        print("| " + " | ".join(cells) + " |")
    verbs = collections.Counter(action.split()[0] for row in rows for action in row["at_once"])
    print("\nfirst words of the actions that solve an item at once:", dict(verbs.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
