"""A step-0 validation taken from a file (`train.baseline`) instead of played again.

A greedy validation of the starting model depends on the model, the items and the rollout's
settings, not on the run's seed: every seed of a study plays the same step 0, which for the
SmolLM2 free-reply recipe takes 40 minutes on a 2-core CPU and 90 s of a 15-minute GPU loan.
A run given the file of an earlier run's step 0 checks it instead: it plays the first turn of
every item and keeps the file only when each first reply, token for token, is the one the file
holds (the same model, prompts and decoding), and when the file holds the same items.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from ..envs import registry
from ..errors import UserError
from ..rollout.trajectory import Trajectory
from ..runs import CONFIG, played_settings

PLAYING_KEYS = (("env", "id"), ("env", "eval_split"), ("env", "kwargs"), ("eval", "max_turns"),
                ("rollout", "max_context"), ("rollout", "max_new_tokens"))
"""Settings that change how a validation's episodes go on after their first turn, which the
replay of the first turn cannot check."""


def donor_differences(path: str | Path, played: Mapping[str, Any]) -> list[str]:
    """When `path` is a run folder's `validation/` file, the `PLAYING_KEYS` its run played with
    that differ from `played` (this run's config as plain data), as "eval.max_turns (10 -> 20)";
    an unset `eval.max_turns` is the environment's. [] for a file outside a run folder (its
    settings cannot be read) and for keys an older run's config lacks."""
    folder = Path(path).resolve().parent
    if folder.name != "validation" or not (folder.parent / CONFIG).is_file():
        return []
    donor = played_settings(folder.parent, log=lambda _: None)
    differences = []
    for section, key in PLAYING_KEYS:
        if key not in donor.get(section, {}):
            continue
        theirs, ours = donor[section][key], played[section][key]
        if (section, key) == ("eval", "max_turns"):
            theirs = theirs or _default_turns(donor["env"].get("id"))
            ours = ours or _default_turns(played["env"]["id"])
        if theirs != ours:
            differences.append(f"{section}.{key} ({theirs!r} -> {ours!r})")
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
