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

from ..errors import UserError
from ..rollout.trajectory import Trajectory


def first_reply_end(trajectory: Trajectory) -> int | None:
    """The index just past the first reply the model generated in `trajectory` (the first run
    of 1s in its loss mask); None when it generated nothing."""
    mask = trajectory.loss_mask
    start = next((i for i, m in enumerate(mask) if m), None)
    if start is None:
        return None
    return next((i for i in range(start, len(mask)) if not mask[i]), len(mask))


def check_baseline(saved: list[Trajectory], replayed: list[Trajectory], samples: int, source: str) -> None:
    """Raise `UserError` unless `saved` (a validation file's episodes) holds each item of
    `replayed` (one episode of each validation item, played for one turn) `samples` times and
    no other, each with the first reply, prompt and tokens included, that the replay generated.

    Args:
        saved: the file's episodes.
        replayed: this run's first turn of each validation item.
        samples: episodes per item in a validation (`eval.samples`).
        source: the file, named in errors.
    """
    def key(t: Trajectory) -> tuple[str, str]:
        return t.env_id, t.item_id

    wanted = Counter({key(t): samples for t in replayed})
    found = Counter(key(t) for t in saved)
    if found != wanted:
        missing = sorted(f"{env}/{item}" for env, item in wanted - found)
        extra = sorted(f"{env}/{item}" for env, item in found - wanted)
        raise UserError(f"train.baseline {source!r} is not a validation of this run's items: "
                        f"{len(saved)} episodes, {samples} wanted of each of {len(replayed)} items; "
                        + "; ".join(part for part in (
                            f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}" if missing else "",
                            f"not validated here {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
                            if extra else "") if part))
    first = {}
    for trajectory in saved:
        first.setdefault(key(trajectory), trajectory)
    differ = []
    for trajectory in replayed:
        end = first_reply_end(trajectory)
        kept = first[key(trajectory)]
        if (end is None or kept.input_ids[:end] != trajectory.input_ids[:end]
                or kept.loss_mask[:end] != trajectory.loss_mask[:end]):
            differ.append(trajectory.item_id)
    if differ:
        raise UserError(f"train.baseline {source!r} was played by another model or in another mode: the first "
                        f"reply of {len(differ)} of {len(replayed)} items differs from this run's "
                        f"({', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''}); play step 0 "
                        "(drop train.baseline)")
