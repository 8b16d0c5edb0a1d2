"""How many BabyAI items a policy could solve by naming the right listed action at once, and which
of them a run's validation solved: the headroom of an RL run whose successes all take one turn;
and how many items start with the goal's objects out of view, and why a run's actions were refused.

Greedy SmolLM2 runs solve an item with their first reply or never (docs/RESULTS.md): after a
refused or useless action the next observation is the same, so greedy decoding repeats itself
to the turn limit. This script measures, from the environment alone (no model), the items one
listed action solves from the first observation, and those that one turn (left or right)
followed by one listed action solves, per category; each action is tried from a snapshot of
the same state. Given validation files (`runs/<run>/validation/step_*.jsonl` or a
`bench/baselines/*.jsonl.gz`), it adds how many items each solved, and how many of those lie
inside the one-action set.

An item whose goal names an object not in the first view (BabyAI's "go to the red ball" with the
ball in another room) needs the agent to look for it. The table counts those items (every object
the goal describes matched by one in view, from minigrid's own descriptions of the mission), and
the items each validation solved among them. A second table sorts each validation's refused
actions by the reason the environment gave; "there is no X in view" is split by whether X is an
object the goal describes (the policy named the goal's object where it could not see it), and by
whether an earlier observation of the episode gave that name (the object has left the view since:
names hold for one observation). A third table sorts each validation's failed episodes by how
they end: repeating one action, refused (listed or not) or accepted (changing nothing or not), or
not repeating one.

    python bench/babyai_headroom.py [--split test] [--episodes N] [VALIDATION.jsonl[.gz] ...]

Run by hand, in seconds on a CPU; the table goes into docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

from agentgym_rl.envs import registry
from agentgym_rl.envs.babyai.actions import parse_action
from agentgym_rl.envs.babyai.render import visible_cells
from agentgym_rl.envs.parsing import extract_action
from agentgym_rl.errors import UserError
from agentgym_rl.jsonlines import read_json_lines

TURNS = ("turn left", "turn right")
REFUSED = re.compile(r"^You cannot do that: (.*?)\. (?=Your goal)")
OBJECT_NAME = re.compile(r"\b(?:red|green|blue|purple|yellow|grey) (?:door|key|ball|box)(?: \d+)?")
OUT_OF_VIEW = "there is no X in view"
LISTED = re.compile(r"^Available actions: (\[.*\])$", re.MULTILINE)
REPEATS = 3  # a failed episode "ends repeating" an action its last 3 replies all name
ENDINGS = ("repeats a refused action the observation listed", "repeats a refused action not listed",
           "repeats an accepted action that changed nothing", "repeats an accepted action that changed the state",
           "does not end repeating one action")


def goal_descriptions(mg) -> list:
    """The object descriptions (minigrid's `ObjDesc`: color and type, None for any) the mission
    of the unwrapped BabyAI env `mg` names, through "and", "then" and "after" instructions."""
    found, stack = [], [mg.instrs]
    while stack:
        instr = stack.pop()
        if hasattr(instr, "instr_a"):
            stack += [instr.instr_b, instr.instr_a]
        else:  # GoTo, Pickup, Open: `desc`; PutNext: `desc_move`, `desc_fixed`
            found += [getattr(instr, name) for name in ("desc", "desc_move", "desc_fixed") if hasattr(instr, name)]
    return found


def goal_in_view(mg, descriptions: list) -> bool:
    """Whether each of the mission's object `descriptions` (`goal_descriptions`) matches an
    object now in view."""
    in_view = {pos for pos, _, _ in visible_cells(mg)}
    return all(in_view.intersection(map(tuple, desc.find_matching_objs(mg)[1])) for desc in descriptions)


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
    """One row per item: its id, category, the actions that solve it at once, whether a turn
    followed by one action does, whether the goal's objects are in the first view, and the
    (color, type) of each object the goal describes (None: any)."""
    env = registry.make("babyai")
    rows = []
    try:
        for task in registry.tasks("babyai", split)[:episodes]:
            env.reset(item_id=task.item_id)
            start = env.snapshot()
            descriptions = goal_descriptions(env.minigrid_env)
            in_view = goal_in_view(env.minigrid_env, descriptions)
            described = [(desc.color, desc.type) for desc in descriptions]
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
                         "after_turn": after_turn, "in_view": in_view, "described": described})
    finally:
        env.close()
    return rows


def solved_items(records: list[dict]) -> set[str]:
    """The item ids a validation file's records mark as solved."""
    return {record["item_id"] for record in records if record.get("success")}


def refusal_reasons(records: list[dict], described: dict[str, list[tuple[str | None, str]]]) -> collections.Counter:
    """A validation file's refused actions by the reason the environment gave (each object's name
    put as X), "there is no X in view" split by whether X matches an object the goal
    describes (`described`: item id → (color, type) pairs, a None color matching any) and by
    whether an earlier observation of the episode named an object so."""
    reasons = collections.Counter()
    for record in records:
        if record["item_id"] not in described:  # outside --split / --episodes
            continue
        messages = record.get("messages") or []
        # The worked example's turns (`rollout.example`, not trained) are another item's and no turn.
        replies = [i for i, message in enumerate(messages)
                   if message["role"] == "assistant" and message.get("loss", True)]
        for turn in record.get("invalid_turns") or []:
            if turn >= len(replies) or replies[turn] + 1 >= len(messages):
                continue
            refused = REFUSED.match(messages[replies[turn] + 1]["content"])
            if refused is None:
                continue
            reason = OBJECT_NAME.sub("X", refused.group(1))
            if reason == OUT_OF_VIEW:
                command = parse_action(extract_action(messages[replies[turn]]["content"]))
                goals = described[record["item_id"]]
                named_goal = command is not None and any(
                    command.obj_type == obj_type and color in (None, command.color) for color, obj_type in goals)
                # Names hold for one observation: an object seen earlier may have left the view.
                # Read what the episode's observations showed, not their refusals' wording.
                shown = [REFUSED.sub("", message["content"])
                         for message in messages[replies[0] - 1:replies[turn]] if message["role"] == "user"]
                earlier = command is not None and any(re.search(rf"\b{command.label}\b", text) for text in shown)
                what = "the goal's object" if named_goal else "another object"
                when = "named as an earlier view named it" if earlier else "a name no earlier view gave"
                reason = f"{reason}: {what}, {when}"
            reasons[reason] += 1
    return reasons


def failure_endings(records: list[dict], items: set[str]) -> collections.Counter:
    """How a validation file's failed episodes of `items` end (one of `ENDINGS`): whether their
    last `REPEATS` replies name one action, and whether the environment refused its last use
    (and whether the observation before it listed that action) or accepted it, leaving a state the
    episode had been in (an idle turn: BabyAI's "go to X" with X reached) or a new one. Greedy
    decoding repeats itself once the observation stops changing, so the ending says what held
    each failure."""
    endings = collections.Counter()
    for record in records:
        if record.get("success") or record["item_id"] not in items:
            continue
        messages = record.get("messages") or []
        replies = [i for i, message in enumerate(messages)
                   if message["role"] == "assistant" and message.get("loss", True)]
        actions = [extract_action(messages[i]["content"]).strip().strip("\"'").lower() for i in replies]
        last_turn = len(replies) - 1
        if len(actions) < REPEATS or len(set(actions[-REPEATS:])) > 1:
            endings[ENDINGS[4]] += 1
        elif last_turn in (record.get("invalid_turns") or []):
            listed = LISTED.search(messages[replies[-1] - 1]["content"])
            named = listed is not None and actions[-1] in [a.lower() for a in json.loads(listed.group(1))]
            endings[ENDINGS[0] if named else ENDINGS[1]] += 1
        else:
            endings[ENDINGS[2] if last_turn in (record.get("idle_turns") or []) else ENDINGS[3]] += 1
    return endings


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
        records = {path: list(read_json_lines(path)) for path in args.validations}  # JSON lines, gzipped or not
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    solved = {path: solved_items(episodes) for path, episodes in records.items()}
    rows = headroom(args.split, args.episodes)
    categories = [category for category, _ in collections.Counter(row["category"] for row in rows).most_common()]
    labels = column_labels(list(solved))
    columns = ["category", "items", "one action", "a turn, then one action", "goal's objects out of view"] + labels
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for category in categories + ["all"]:
        mine = [row for row in rows if category in ("all", row["category"])]
        at_once = {row["item_id"] for row in mine if row["at_once"]}
        out_of_view = {row["item_id"] for row in mine if not row["in_view"]}
        cells = [category, str(len(mine)), str(len(at_once)),
                 str(len(at_once) + sum(row["after_turn"] for row in mine)), str(len(out_of_view))]
        for items in solved.values():
            in_category = items & {row["item_id"] for row in mine}
            cells.append(f"{len(in_category)} ({len(in_category & at_once)} of them one-action, "
                         f"{len(in_category & out_of_view)} out of view)")
        print("| " + " | ".join(cells) + " |")
    verbs = collections.Counter(action.split()[0] for row in rows for action in row["at_once"])
    print("\nfirst words of the actions that solve an item at once:", dict(verbs.most_common()))
    if solved:
        described = {row["item_id"]: row["described"] for row in rows}
        counts = {label: refusal_reasons(records[path], described) for label, path in zip(labels, solved)}
        reasons = sorted({reason for counted in counts.values() for reason in counted},
                         key=lambda reason: -sum(counted[reason] for counted in counts.values()))
        print("\n| refused actions, by the reason given | " + " | ".join(labels) + " |")
        print("|" + "---|" * (len(labels) + 1))
        for reason in reasons + ["all"]:
            cells = [sum(counted.values()) if reason == "all" else counted[reason] for counted in counts.values()]
            print(f"| {reason} | " + " | ".join(map(str, cells)) + " |")
        items = {row["item_id"] for row in rows}
        endings = {label: failure_endings(records[path], items) for label, path in zip(labels, solved)}
        print(f"\n| failed episodes, by how they end (the last {REPEATS} replies) | " + " | ".join(labels) + " |")
        print("|" + "---|" * (len(labels) + 1))
        for ending in [*ENDINGS, "all"]:
            cells = [sum(counted.values()) if ending == "all" else counted[ending] for counted in endings.values()]
            print(f"| {ending} | " + " | ".join(map(str, cells)) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
