"""A training run's steps and validations as the Markdown tables docs/RESULTS.md shows.

From a run folder (`runs/<name>`, written with `train.save_trajectories`), one column per step:
sampled success (and the greedy members' apart, with `algo.greedy_samples`), groups whose rewards
differ, the turns played (and their total over the steps saved so far: the experience a run had),
the share of actions the environment refused, the replies that repeat the one before, the
accepted actions by kind (`Trajectory.action_verbs`, recorded when the run located actions, e.g.
for `algo.rare_action_bonus`), the tokens each token bonus was paid at (`algo.rare_action_bonus`,
`algo.discovery_bonus`) and the step's seconds. Then one row per validation in `validation/`
(step 0's too, when the run took it from `train.baseline`): success, items solved per category,
refused actions, mean turns, the replies that repeat the one before word for word (a repeated
useless action spends the episode's turns; after BabyAI's note that the last action changed
nothing, `env.kwargs.note_unchanged`, counted apart too) and the kinds of action the greedy
replies wrote (the worked example's turns left out); and each validation paired item by item
with the first.

    python bench/run_table.py runs/free_rare_s1 [--kinds 4] [--against FILE] [--also FILE] [--against-solved NAME=IDS]

`--against` puts a validation file of another run first (e.g. a kept step-0 file of the recipe
without the setting the run changed), so every validation is paired with it. Each validation's
solved items are printed in RESULTS' short form ("babyai_1, 2, 6"), and `--against-solved
NAME="babyai_1, 2, 6"` pairs every validation with such a list, as RESULTS recorded it for a run
whose files are gone (the items not listed count as failed). `--also` adds an evaluation of one of
the run's checkpoints written elsewhere (`agentgym-rl eval --trajectories FILE`) after the
validations, paired as they are.

Run by hand, in seconds; the tables go into docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
from pathlib import Path

import yaml

from agentgym_rl import metric_names as metric
from agentgym_rl.agent.sampling import greedy_members
from agentgym_rl.envs.babyai.actions import parse_action
from agentgym_rl.envs.babyai.env import UNCHANGED_NOTE
from agentgym_rl.envs.parsing import action_verb, extract_action
from agentgym_rl.errors import UserError
from agentgym_rl.eval.metrics import change_sentence
from agentgym_rl.jsonlines import read_json_lines

#: A step column's row for each token bonus → the metric counting the tokens it was paid at.
BONUS_TOKENS = {"tokens given the rare-action bonus": "adv/rare_action_tokens",
                "tokens given the discovery bonus": "adv/discovery_tokens"}


def action_kind(env_id: str, reply: str) -> str:
    """The kind of action a reply wrote, as `info["action_kind"]` names it (BabyAI's parser), else
    its first word."""
    if "action:" not in reply.lower():
        return "(no Action: line)"
    action = extract_action(reply) or ""
    if env_id == "babyai":
        command = parse_action(action)
        return command.verb if command is not None else "(not an action)"
    return action_verb(action) or "(empty)"


def share(successes: list[bool]) -> str:
    """"25%" of the episodes given; "" when none."""
    return f"{100 * sum(successes) / len(successes):.0f}%" if successes else ""


def episode_turns(episode: dict) -> int:
    """The turns an episode played: its `turns`, else one per turn reward (older files)."""
    return int(episode.get("turns", len(episode.get("turn_rewards", []))))


def replies(episode: dict, example_turns: int) -> list[str]:
    """The episode's replies, the worked example's turns left out."""
    return [m["content"] for m in episode["messages"] if m["role"] == "assistant"][example_turns:]


def repeats(episodes: list[dict], example_turns: int) -> str:
    """"91% (1,405 of 1,550)": of the replies that follow another, those that repeat it word for word."""
    repeated = followers = 0
    for e in episodes:
        said = replies(e, example_turns)
        repeated += sum(before == after for before, after in zip(said, said[1:]))
        followers += max(len(said) - 1, 0)
    return f"{100 * repeated / max(followers, 1):.0f}% ({repeated:,} of {followers:,})"


def after_note(episodes: list[dict], example_turns: int) -> str:
    """"58% (15 of 26), the same action 92%": of the replies that follow an observation opening with
    BabyAI's note (`env.kwargs.note_unchanged`: the action before changed nothing), those that
    repeat the reply before it word for word, and those that name the same action (a new thought
    before it is no change of course); "" when no observation holds the note."""
    repeated = same_action = noted = 0
    for e in episodes:
        messages = [m for m in e["messages"] if m["role"] in ("user", "assistant")]
        said = [i for i, m in enumerate(messages) if m["role"] == "assistant"][example_turns:]
        for before, after in zip(said, said[1:]):
            if messages[after - 1]["role"] == "user" and messages[after - 1]["content"].startswith(UNCHANGED_NOTE):
                noted += 1
                repeated += messages[before]["content"] == messages[after]["content"]
                same_action += (extract_action(messages[before]["content"]) or "").lower() == (
                    extract_action(messages[after]["content"]) or "").lower()
    return (f"{100 * repeated / noted:.0f}% ({repeated:,} of {noted:,}), the same action "
            f"{100 * same_action / noted:.0f}%" if noted else "")


def step_rows(run: Path, kinds_shown: int, greedy_samples: int = 0,
              example_turns: int = 0) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the per-step table: one column per step with saved trajectories. With
    `greedy_samples` (the run's `algo.greedy_samples`), the first that many episodes of each group
    (a step's file lists them by group, then sample) are the greedy members, counted apart.
    `example_turns`: the worked example's turns, left out of the replies that repeat."""
    metrics: dict[int, dict] = collections.defaultdict(dict)
    for row in read_json_lines(run / "metrics.jsonl"):  # a validation logs its own row for the step
        if "step" in row:
            metrics[row["step"]].update(row)
    files = sorted((run / "trajectories").glob("step_*.jsonl"))
    if not files:
        raise UserError(f"{run / 'trajectories'} holds no step_*.jsonl: was the run trained with "
                        "train.save_trajectories?")
    steps, columns, kinds_total, turns_so_far = [], [], collections.Counter(), 0
    for path in files:
        step = int(path.stem.split("_")[1])
        episodes = list(read_json_lines(path))
        rewards: dict[int, set[float]] = collections.defaultdict(set)
        for e in episodes:
            rewards[e.get("group", 0)].add(float(e.get("reward", 0.0)))
        turns = sum(episode_turns(e) for e in episodes)
        turns_so_far += turns
        kinds = collections.Counter(k for e in episodes for k in e.get("action_verbs", []))
        kinds_total.update(kinds)
        m = metrics.get(step, {})
        greedy = greedy_members([e.get("group", 0) for e in episodes], greedy_samples)
        columns.append({
            "sampled success": share([e["success"] for e, g in zip(episodes, greedy) if not g]),
            "greedy members' success": share([e["success"] for e, g in zip(episodes, greedy) if g]),
            "groups whose rewards differ": f"{sum(len(r) > 1 for r in rewards.values())} of {len(rewards)}",
            "turns played (total so far)": f"{turns:,} ({turns_so_far:,})",
            "refused actions": f"{100 * sum(e.get('invalid_actions', 0) for e in episodes) / max(turns, 1):.0f}%",
            "replies repeating the last": repeats(episodes, example_turns),
            "replies after a note repeating the last": after_note(episodes, example_turns),
            "kinds": kinds,
            **{label: str(int(m.get(name, 0))) for label, name in BONUS_TOKENS.items()},
            "step (s): rollout + update": f"{m.get(metric.TIME_ROLLOUT_S, 0):.0f} + {m.get(metric.TIME_UPDATE_S, 0):.0f}",
        })
        steps.append(step)
    shown = [k for k, _ in kinds_total.most_common(kinds_shown)]
    header = [f"step ({len(episodes)} episodes)"] + [str(s) for s in steps]
    labels = ["sampled success", "groups whose rewards differ", "turns played (total so far)", "refused actions",
              "replies repeating the last"]
    if greedy_samples:
        labels.insert(1, "greedy members' success")
    if any(c["replies after a note repeating the last"] for c in columns):  # env.kwargs.note_unchanged
        labels.append("replies after a note repeating the last")
    rows = [[label] + [c[label] or "" for c in columns] for label in labels]
    if shown:
        rows.append([f"accepted actions: {' / '.join(shown)}"]
                    + [" / ".join(str(c["kinds"][k]) for k in shown) for c in columns])
        for label in BONUS_TOKENS:  # the bonuses the run paid
            if any(c[label] != "0" for c in columns):
                rows.append([label] + [c[label] for c in columns])
    rows.append(["step (s): rollout + update"] + [c["step (s): rollout + update"] for c in columns])
    return header, rows


def validation_row(name: str, episodes: list[dict], example_turns: int, categories: list[str],
                   kinds_shown: int) -> list[str]:
    """One validation's row: success, solved per category, refused actions, mean turns, repeated
    replies, kinds written."""
    solved = collections.Counter(e.get("category", "") for e in episodes if e["success"])
    turns = sum(e.get("turns", 0) for e in episodes)
    refused = sum(e.get("invalid_actions", 0) for e in episodes)
    kinds = collections.Counter(action_kind(e.get("env_id", ""), reply)
                                for e in episodes for reply in replies(e, example_turns))
    wins = sum(e["success"] for e in episodes)
    return [name, f"{100 * wins / len(episodes):.1f}% ({wins})"] + [str(solved[c]) for c in categories] + [
        f"{100 * refused / max(turns, 1):.0f}% ({refused:,} of {turns:,})", f"{turns / len(episodes):.1f}",
        repeats(episodes, example_turns), ", ".join(f"{k} {n}" for k, n in kinds.most_common(kinds_shown))]


def split_id(item: str) -> tuple[str, int | None]:
    """"babyai_12" into ("babyai", 12); an id without a trailing number into (itself, None)."""
    head, _, number = item.rpartition("_")
    return (head, int(number)) if head and number.isdigit() else (item, None)


def solved_ids(episodes: list[dict]) -> str:
    """The solved items in RESULTS' short form: "babyai_1, 2, 10" (a prefix written once)."""
    short, prefix = [], None
    ids = sorted((split_id(e["item_id"]) for e in episodes if e["success"]),
                 key=lambda pair: (pair[0], -1 if pair[1] is None else pair[1]))
    for head, number in ids:
        if number is None:
            short.append(head)
        elif head == prefix:
            short.append(str(number))
        else:
            short.append(f"{head}_{number}")
        prefix = head if number is not None else None
    return ", ".join(short) or "none"


def parse_solved(text: str) -> tuple[str, set[str]]:
    """`NAME=babyai_1, 2, 10` (`solved_ids`' form, or whole ids) into its name and item ids."""
    name, sep, listed = text.partition("=")
    if not sep or not name.strip():
        raise UserError(f"--against-solved wants NAME=IDS (e.g. gigpo_s0=\"babyai_1, 2, 10\"), not {text!r}")
    items, prefix = set(), None
    for part in filter(None, (p.strip() for p in listed.split(","))):
        if part.isdigit():
            if prefix is None:
                raise UserError(f"--against-solved: {part!r} comes before any whole id (such as babyai_{part})")
            part = f"{prefix}_{part}"
        head, number = split_id(part)
        prefix = head if number is not None else None
        items.add(part)
    return name.strip(), items


def successes(episodes: list[dict]) -> dict[str, float]:
    """Each item's success (1.0 or 0.0), as `change_sentence` pairs them."""
    return {e["item_id"]: float(e["success"]) for e in episodes}


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def file_label(path: Path) -> str:
    """How a row names a file: RUN/step_N.jsonl for one in a run's validation folder, whose name
    another run's file may share; otherwise its name."""
    return f"{path.parent.parent.name}/{path.name}" if path.parent.name == "validation" else path.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run folder (runs/<name>)")
    parser.add_argument("--kinds", type=int, default=4, help="kinds of action shown (the most frequent)")
    parser.add_argument("--against", type=Path, help="a validation file (.jsonl or .jsonl.gz) to pair every "
                        "validation with, shown first (RUN/step_N.jsonl when it lies in a run's validation folder)")
    parser.add_argument("--also", type=Path, action="append", default=[], help="an evaluation file kept outside "
                        "the run's validation folder (`agentgym-rl eval --trajectories`), shown after the "
                        "validations; repeatable")
    parser.add_argument("--against-solved", metavar="NAME=IDS", help="pair every validation with a run known "
                        "only by its solved items, as RESULTS lists them: NAME=\"babyai_1, 2, 10\"")
    args = parser.parse_args(argv)
    try:
        recorded = parse_solved(args.against_solved) if args.against_solved else None
        if not (args.run / "metrics.jsonl").is_file():
            raise UserError(f"{args.run} is not a run folder (no metrics.jsonl)")
        config = yaml.safe_load((args.run / "config.yaml").read_text()) or {}
        rollout = config.get("rollout") or {}
        examples = rollout.get("example") or []
        example_turns = (len(examples) if isinstance(examples, list) else 1) * int(rollout.get("example_turns") or 0)
        header, rows = step_rows(args.run, args.kinds, int((config.get("algo") or {}).get("greedy_samples") or 0),
                                 example_turns)
        print(markdown(header, rows), end="\n\n")
        validations = [(path.name, list(read_json_lines(path)))
                       for path in sorted((args.run / "validation").glob("step_*.jsonl"))]
        validations += [(file_label(path), list(read_json_lines(path))) for path in args.also]
        if args.against:
            validations.insert(0, (file_label(args.against), list(read_json_lines(args.against))))
        if not validations:
            return 0
        categories = sorted({e.get("category", "") for _, eps in validations for e in eps},
                            key=lambda c: -sum(e.get("category", "") == c for e in validations[0][1]))
        header = ["greedy validation", "success"] + [
            f"{c} ({sum(e.get('category', '') == c for e in validations[0][1])})" for c in categories] + [
            "refused actions", "mean turns", "replies repeating the last", "actions written"]
        print(markdown(header, [validation_row(name, eps, example_turns, categories, args.kinds + 2)
                                for name, eps in validations]), end="\n\n")
        for name, eps in validations:
            noted = after_note(eps, example_turns)
            if noted:
                print(f"{name}: replies after a note (\"{UNCHANGED_NOTE}\") repeating the last: {noted}")
        for name, eps in validations:
            print(f"{name} solved: {solved_ids(eps)}")
        first_name, first = validations[0]
        for name, eps in validations[1:]:
            print(f"{name} against {first_name}: {change_sentence(successes(first), successes(eps))}")
        if recorded:
            other, listed = recorded
            for name, eps in validations:
                after = successes(eps)
                unknown = sorted(listed - after.keys())
                if unknown:
                    raise UserError(f"--against-solved {other}: {', '.join(unknown[:3])} not among {name}'s items")
                before = {item: float(item in listed) for item in after}
                print(f"{name} against {other}: {change_sentence(before, after)}")
    except (UserError, OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    sys.exit(main())
