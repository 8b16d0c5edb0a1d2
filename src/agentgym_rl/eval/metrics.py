"""Success metrics over repeated samples (pure functions)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from math import comb, sqrt
from typing import Any

from ..rollout.trajectory import Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al. 2021, eq. 1):
    1 − C(n−c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def item_success(trajectories: list[Trajectory]) -> dict[str, float]:
    """Each item's success rate over its samples (the per-item input of `paired_difference`)."""
    per_item: dict[str, list[bool]] = {}
    for t in trajectories:
        per_item.setdefault(t.item_id, []).append(t.success)
    return {item: sum(s) / len(s) for item, s in per_item.items()}


def paired_difference(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, int, int]:
    """Mean change in success over the same items, its standard error (the sample standard
    deviation of the per-item changes over √n; NaN for one item, which gives no spread), and
    how many items were gained and lost (their success rate rose or fell).

    Raises:
        ValueError: no items, or items in one evaluation and not the other (the pairing needs both).
    """
    if set(before) != set(after):
        odd = sorted(set(before) ^ set(after))
        raise ValueError(f"paired evaluations must hold the same items; {len(odd)} are in one only: {odd[:5]}")
    if not before:
        raise ValueError("no items to pair")
    diffs = [float(after[i]) - float(before[i]) for i in sorted(before)]
    n = len(diffs)
    mean = sum(diffs) / n
    error = sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else float("nan")
    return mean, error, sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)


def change_sentence(before: dict[str, float], after: dict[str, float]) -> str:
    """`paired_difference` in words: "+34.4 points: 34 items gained, 3 lost (paired standard
    error 5.7 points over 90 items)"."""
    delta, noise, gained, lost = paired_difference(before, after)
    error = (f"paired standard error {100 * noise:.1f} points over {len(before)} items" if len(before) > 1
             else "one item: no standard error")
    return f"{100 * delta:+.1f} points: {gained} items gained, {lost} lost ({error})"


@dataclass(frozen=True)
class EnvShare:
    """One environment's part of a summary (a mix has several)."""

    success: float
    avg_reward: float


@dataclass(frozen=True)
class Summary:
    """What `summarize` makes of a set of episodes.

    Attributes:
        episodes: items played (each `samples` times).
        samples: episodes per item (the fewest any item has).
        success: Avg@n, the mean success over every episode.
        pass_at_k: Pass@k over items, k = `k`.
        avg_reward, reward_std: the mean and spread (population SD) of episode rewards.
        avg_turns: mean turns an episode took.
        reply_tokens: mean trained tokens per turn (a reply's length).
        invalid_action_rate: rejected actions per turn.
        idle_turn_rate: accepted turns that changed nothing (`Trajectory.idle_turns`), per turn.
        errors: episodes that failed to run.
        by_category, pass_at_k_by_category: success and Pass@k of each category of items.
        by_env: each environment's success and reward (one entry unless a mix).
    """

    episodes: int
    samples: int
    success: float
    pass_at_k: float
    k: int
    avg_reward: float
    reward_std: float
    avg_turns: float
    reply_tokens: float
    invalid_action_rate: float
    idle_turn_rate: float
    errors: int
    by_category: dict[str, float]
    pass_at_k_by_category: dict[str, float]
    by_env: dict[str, EnvShare]

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (`eval --json`, `bench-agent`'s results.json)."""
        return asdict(self)


def summarize(trajectories: list[Trajectory], k: int | None = None) -> Summary:
    """Avg@n (mean success over every sample), Pass@k, mean reward, per category.

    Trajectories of one item are its samples; k defaults to the number of samples per item.
    """
    by_item: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_item[t.item_id].append(t)
    if not by_item:
        raise ValueError("no trajectories to summarize")
    samples = min(len(v) for v in by_item.values())
    k = k or samples
    item_pass = {item: pass_at_k(len(ts), sum(t.success for t in ts), k) for item, ts in by_item.items()}
    categories: dict[str, list[Trajectory]] = defaultdict(list)
    category_items: dict[str, list[str]] = defaultdict(list)
    for item, ts in by_item.items():
        categories[ts[0].category] += ts
        category_items[ts[0].category].append(item)
    turns = sum(t.turns for t in trajectories)
    avg_reward = sum(t.reward for t in trajectories) / len(trajectories)
    return Summary(
        episodes=len(by_item),
        samples=samples,
        success=sum(t.success for t in trajectories) / len(trajectories),
        pass_at_k=sum(item_pass.values()) / len(item_pass),
        k=k,
        avg_reward=avg_reward,
        reward_std=sqrt(sum((t.reward - avg_reward) ** 2 for t in trajectories) / len(trajectories)),
        avg_turns=turns / len(trajectories),
        reply_tokens=sum(sum(t.loss_mask) for t in trajectories) / max(turns, 1),
        invalid_action_rate=sum(t.invalid_actions for t in trajectories) / max(turns, 1),
        idle_turn_rate=sum(len(t.idle_turns) for t in trajectories) / max(turns, 1),
        errors=sum(t.error is not None for t in trajectories),
        by_category={c: sum(t.success for t in ts) / len(ts) for c, ts in sorted(categories.items())},
        pass_at_k_by_category={c: sum(item_pass[i] for i in items) / len(items)
                               for c, items in sorted(category_items.items())},
        by_env={env_id: EnvShare(sum(t.success for t in ts) / len(ts), sum(t.reward for t in ts) / len(ts))
                for env_id, ts in sorted(_by_env(trajectories).items())},
    )


def _by_env(trajectories: list[Trajectory]) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.env_id].append(t)
    return groups


def pass_at_k_curve(trajectories: list[Trajectory]) -> list[float]:
    """Pass@k for k = 1..n, averaged over items, each item's from its own n samples with the
    unbiased estimator (`pass_at_k`); n is the fewest samples any item has.

    Pass@1 equals Avg@n when every item has n samples."""
    by_item: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        by_item[t.item_id].append(bool(t.success))
    if not by_item:
        raise ValueError("no trajectories to summarize")
    n = min(len(v) for v in by_item.values())
    return [sum(pass_at_k(len(s), sum(s), k) for s in by_item.values()) / len(by_item) for k in range(1, n + 1)]


def success_within_turns(trajectories: list[Trajectory], max_turns: int) -> list[float]:
    """Success rate with a turn budget of b = 1..max_turns: an episode counts when it succeeded
    within b turns.

    This equals playing again with each smaller budget (same seeds), because a policy does not
    see the budget: the first b turns of an episode are the same whatever the limit, so cutting
    it at b only loses the successes that came later."""
    if not trajectories:
        raise ValueError("no trajectories to summarize")
    return [sum(t.success and t.turns <= budget for t in trajectories) / len(trajectories)
            for budget in range(1, max_turns + 1)]
