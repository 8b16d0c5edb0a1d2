"""A step-0 validation taken from a file (`train.baseline`) instead of played again.

A greedy validation of the starting model depends on the model, the items and the rollout's
settings, not on the run's seed: every seed of a study plays the same step 0, which for the
SmolLM2 free-reply recipe takes 40 minutes on a 2-core CPU and 90 s of a 15-minute GPU loan.
A run given the file of an earlier run's step 0 checks it instead: it plays the first turn of
every item and keeps the file only when each first reply, token for token, is the one the file
holds (the same model, prompts and decoding), and when the file holds the same items.

The replay cannot see the settings that only change later turns (`PLAYING_KEYS`: the
environment's options, the turn limit, the context): those are read from the run folder the
file lies in, or, for a file kept elsewhere, from the settings file beside it
(`settings_path`, written by `write_settings`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from ..envs import registry
from ..errors import UserError
from ..rollout.trajectory import Trajectory
from ..runs import CONFIG, played_settings

PLAYING_KEYS = (("env", "id"), ("env", "eval_split"), ("env", "kwargs"), ("eval", "max_turns"),
                ("rollout", "max_context"), ("rollout", "max_new_tokens"), ("rollout", "stop_strings"))
"""Settings that change how a validation's episodes go on after their first turn, which the
replay of the first turn cannot check."""

LATER_KEYS = {("rollout", "stop_strings"): []}
"""`PLAYING_KEYS` that came after some run folders and settings files were written, with the
value those were played with (the setting's default: it did not exist yet)."""

_UNKNOWN = object()  # a key an older donor lacks, not one of LATER_KEYS: not compared


def settings_path(path: str | Path) -> Path:
    """The settings file kept beside a validation file outside a run folder:
    `x_step0.jsonl.gz` -> `x_step0.settings.json`."""
    path = Path(path)
    name = path.name
    for suffix in (".gz", ".jsonl"):
        name = name.removesuffix(suffix)
    return path.with_name(name + ".settings.json")


def played_with(played: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The `PLAYING_KEYS` of a config as plain data (`to_dict` of it), an unset `eval.max_turns`
    made the environment's: what `write_settings` keeps and `donor_differences` compares."""
    kept: dict[str, dict[str, Any]] = {}
    for section, key in PLAYING_KEYS:
        value = played[section][key] if key in played[section] else LATER_KEYS[(section, key)]
        if (section, key) == ("eval", "max_turns"):
            value = value or _default_turns(played["env"]["id"])
        kept.setdefault(section, {})[key] = value
    return kept


def write_settings(path: str | Path, played: Mapping[str, Any]) -> Path:
    """Keep beside the validation file `path` the settings it was played with (`played`: the
    config of the run or evaluation that played it, as plain data), so a run given it as
    `train.baseline` outside its run folder can check them. Returns the settings file."""
    target = settings_path(path)
    target.write_text(json.dumps(played_with(played), indent=1, sort_keys=True) + "\n")
    return target


def donor_settings(path: str | Path) -> dict[str, Any] | None:
    """The settings the validation file `path` was played with: its run's config when it lies in a
    run folder's `validation/`, else its settings file (`settings_path`); None when neither exists."""
    folder = Path(path).resolve().parent
    if folder.name == "validation" and (folder.parent / CONFIG).is_file():
        return played_settings(folder.parent, log=lambda _: None)
    kept = settings_path(path)
    if not kept.is_file():
        return None
    try:
        donor = json.loads(kept.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read {str(kept)!r}, the settings of train.baseline {str(path)!r}: {error}") from None
    if not isinstance(donor, dict) or not all(isinstance(donor.get(s, {}), dict) for s, _ in PLAYING_KEYS):
        raise UserError(f"{str(kept)!r}, the settings of train.baseline {str(path)!r}, is not a mapping of sections "
                        f"({', '.join(sorted({s for s, _ in PLAYING_KEYS}))}) to settings")
    return donor


def donor_differences(donor: Mapping[str, Any], played: Mapping[str, Any]) -> list[str]:
    """The `PLAYING_KEYS` of `donor` (`donor_settings` of a validation file) that differ from
    `played` (this run's config as plain data), as "eval.max_turns (10 -> 20)"; an unset
    `eval.max_turns` is the environment's. Keys an older run's config lacks are not compared,
    but for `LATER_KEYS`, which it was played with at their defaults."""
    ours = played_with(played)
    differences = []
    for section, key in PLAYING_KEYS:
        theirs = donor.get(section, {}).get(key, LATER_KEYS.get((section, key), _UNKNOWN))
        if theirs is _UNKNOWN:
            continue
        if (section, key) == ("eval", "max_turns"):
            theirs = theirs or _default_turns(donor.get("env", {}).get("id"))
        if theirs != ours[section][key]:
            differences.append(f"{section}.{key} ({theirs!r} -> {ours[section][key]!r})")
    return differences


def _default_turns(env_id: Any) -> int | None:
    return registry.spec(env_id).max_turns if env_id in registry.env_ids() else None


def check_file(saved: list[Trajectory], episodes: int, max_turns: int, max_new_tokens: int, source: str) -> None:
    """Raise `UserError` unless `saved` could be this run's step 0 by its shape alone: `episodes`
    episodes, none longer than `max_turns` turns, no reply longer than `max_new_tokens` tokens.
    Run before the replay, which costs the first turn of every item."""
    if len(saved) != episodes:
        raise UserError(f"train.baseline {source!r} holds {len(saved)} episodes; this run validates {episodes}")
    turns = max((t.turns for t in saved), default=0)
    if turns > max_turns:
        raise UserError(f"train.baseline {source!r} has episodes of {turns} turns; this run validates "
                        f"{max_turns} (eval.max_turns)")
    reply = max((end - start for t in saved for start, end in t.replies()), default=0)
    if reply > max_new_tokens:
        raise UserError(f"train.baseline {source!r} has replies of {reply} tokens; this run's are at most "
                        f"{max_new_tokens} (rollout.max_new_tokens)")


def check_baseline(saved: list[Trajectory], replayed: list[Trajectory], samples: int, source: str) -> None:
    """Raise `UserError` unless `saved` (a validation file's episodes) holds each item of
    `replayed` (one episode of each validation item, played for one turn) `samples` times and
    no other, each opening with the same first turn as the replay: prompt and reply, token for
    token, the reply ending where the replay's does.

    Args:
        saved: the file's episodes.
        replayed: this run's first turn of each validation item.
        samples: episodes per item in a validation (`eval.samples`).
        source: the file, named in errors.
    """
    def key(t: Trajectory) -> tuple[str, str]:
        return t.env_id, t.item_id

    wanted = Counter()
    for trajectory in replayed:
        wanted[key(trajectory)] += samples
    found = Counter(key(t) for t in saved)
    if found != wanted:
        missing = sorted(f"{env}/{item}" for env, item in wanted - found)
        extra = sorted(f"{env}/{item}" for env, item in found - wanted)
        raise UserError(f"train.baseline {source!r} is not a validation of this run's items: "
                        f"{len(saved)} episodes, {samples} wanted of each of {len(replayed)} items; "
                        + "; ".join(part for part in (
                            f"missing {_some(missing)}" if missing else "",
                            f"not validated here {_some(extra)}" if extra else "") if part))
    first = {}
    for trajectory in saved:
        first.setdefault(key(trajectory), trajectory)
    differ = []
    for trajectory in replayed:
        # The same first reply span and the same ids up to its end: so the same loss mask there too.
        kept, opening = first[key(trajectory)], trajectory.replies()[:1]
        end = opening[0][1] if opening else 0
        if not opening or kept.replies()[:1] != opening or kept.input_ids[:end] != trajectory.input_ids[:end]:
            differ.append(f"{trajectory.env_id}/{trajectory.item_id}")
    if differ:
        raise UserError(f"train.baseline {source!r} does not open as this run plays: the first turn of "
                        f"{len(differ)} of {len(replayed)} items differs ({_some(differ)}). Another model, "
                        "prompt or reply setting played it, or, for a few items, the rounding of another "
                        "device or batch composition changed a greedy choice; play step 0 (drop train.baseline)")


def _some(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (" ..." if len(names) > shown else "")
