"""Which categories a step's tasks come from (`curriculum.kind: success`): a curriculum over an
environment's levels (BabyAI's GoTo, Pickup, AOD, ...; TextCraft's depths) by success rate.

A group-relative advantage (GRPO, RLOO, GiGPO) compares the samples of one task: a group whose
`group_size` episodes all succeed, or all fail, has no reward spread and teaches nothing but the
per-turn penalties. If the policy solves a category's tasks with probability p, a group of G
samples of one of them differs in success with probability

    spread(p, G) = 1 - p^G - (1 - p)^G,

0 for a category always or never solved, largest at p = 1/2. The curriculum estimates each
category's p from the training episodes played so far, as (1 + successes) / (2 + episodes) (one
success and one failure as a prior, so a category not yet played counts as p = 1/2), with the
counts of each earlier step multiplied by `memory` once a step, so that recent steps weigh more.
A step draws each task's category with probability

    share(c) = (1 - explore) * spread(p_c, G) / sum over c' of spread(p_c', G) + explore / C,

C the number of categories (`explore` keeps every category in play, as the policy's rate on one
it never solves can only be learnt by playing it), then a task of that category the step has not
drawn yet, uniformly. With groups of one (PPO, REINFORCE++) G counts as 2: spread is then
2p(1 - p), the variance of the success.

The estimate behind step k's draw depends on the counts of steps 0..k-1 alone, kept per step
(the trainer records a step's counts as its rollout ends, before the next step draws, also when
`train.asynchronous` plays steps ahead of the learner), and a checkpoint keeps the counts of the
steps it holds, so a resumed run draws what the run that went straight through drew.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from ..envs.tasks import Task


def spread_chance(p: float, group_size: int) -> float:
    """The probability that `group_size` samples of a task solved with probability `p` do not all
    succeed or all fail: 1 - p^G - (1 - p)^G, G = max(group_size, 2).

    Example: p = 0.5, G = 4 -> 1 - 1/16 - 1/16 = 0.875; p = 0.1, G = 4 -> 1 - 0.0001 - 0.6561 = 0.3438."""
    g = max(group_size, 2)
    return 1.0 - p ** g - (1.0 - p) ** g


def category_of(env_id: str, category: str, mixed: bool) -> str:
    """A category's name in the curriculum and its metrics: the task's own ("GoTo"), prefixed by
    its environment in a mix ("babyai/GoTo"), where two members may name categories alike."""
    return f"{env_id}/{category}" if mixed else category


def only_categories(tasks: Sequence[Task], categories: Sequence[str], mixed: bool = False) -> list[Task]:
    """The tasks whose category (as `category_of` names it) is one of `categories`
    (`curriculum.categories`)."""
    wanted = set(categories)
    return [task for task in tasks if category_of(task.env_id, task.category, mixed) in wanted]


class SuccessCurriculum:
    """Per-category success counts of each step played, and the draws they lead to.

    Args:
        group_size: the samples a step plays of each task (G above).
        memory: in [0, 1): the weight an earlier step's counts keep each step (0: the last step
            alone).
        explore: in [0, 1]: the share of draws spread evenly over the categories.
        mixed: names categories with their environment (`category_of`).
    """

    def __init__(self, group_size: int, memory: float, explore: float, mixed: bool = False) -> None:
        self.group_size, self.memory, self.explore, self.mixed = group_size, memory, explore, mixed
        self.counts: dict[int, dict[str, tuple[int, int]]] = {}
        """step -> category -> (successes, episodes) among the step's finished training episodes."""

    def record(self, step: int, episodes: Iterable[Any]) -> None:
        """The counts of step `step` (0-based) from its episodes (`Trajectory`: `env_id`,
        `category`, `success`, `error`); one that an environment failure cut short has no honest
        outcome and is left out. Recording a step again replaces its counts."""
        counts: dict[str, list[int]] = {}
        for episode in episodes:
            if episode.error is not None:
                continue
            tally = counts.setdefault(category_of(episode.env_id, episode.category, self.mixed), [0, 0])
            tally[0] += int(bool(episode.success))
            tally[1] += 1
        self.counts[step] = {category: (won, played) for category, (won, played) in counts.items()}

    def rates(self, step: int, categories: Sequence[str]) -> dict[str, float]:
        """Each category's estimated success rate before step `step`: (1 + s) / (2 + n), s and n
        the successes and episodes of steps j < step, each weighted memory^(step - 1 - j)."""
        won = dict.fromkeys(categories, 0.0)
        played = dict.fromkeys(categories, 0.0)
        for past, counts in self.counts.items():
            if past >= step:
                continue
            weight = self.memory ** (step - 1 - past)
            for category, (s, n) in counts.items():
                if category in won:
                    won[category] += weight * s
                    played[category] += weight * n
        return {category: (1.0 + won[category]) / (2.0 + played[category]) for category in categories}

    def shares(self, step: int, categories: Sequence[str]) -> dict[str, float]:
        """The probability step `step` draws each category for a task (the module's formula)."""
        if not categories:
            return {}
        spread = {c: spread_chance(p, self.group_size) for c, p in self.rates(step, categories).items()}
        total = sum(spread.values())
        even = 1.0 / len(categories)
        # spread is > 0 for every p in (0, 1), which the prior keeps the estimates in
        return {c: (1.0 - self.explore) * spread[c] / total + self.explore * even for c in categories}

    def draw(self, step: int, pool: Sequence[Task], count: int, rng: random.Random) -> list[Task]:
        """`count` distinct tasks of `pool` for step `step`: each one's category by `shares`
        (among the categories with tasks left), then a task of it not yet drawn, uniformly."""
        left: dict[str, list[Task]] = {}
        for task in pool:
            left.setdefault(category_of(task.env_id, task.category, self.mixed), []).append(task)
        shares = self.shares(step, sorted(left))
        chosen: list[Task] = []
        while len(chosen) < count and any(left.values()):
            open_ = [c for c in sorted(left) if left[c]]
            category = rng.choices(open_, weights=[shares[c] for c in open_])[0]
            tasks = left[category]
            chosen.append(tasks.pop(rng.randrange(len(tasks))))
        return chosen

    def state_dict(self, before: int) -> dict[str, Any]:
        """The counts of steps < `before` (what a checkpoint after `before` steps holds; a step
        already played ahead is played, and recorded, again on resume)."""
        recorded = list(self.counts.items())  # a rollout thread ahead may record a step meanwhile
        return {"counts": {step: {c: list(n) for c, n in counts.items()} for step, counts in recorded if step < before}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {int(step): {c: (int(n[0]), int(n[1])) for c, n in counts.items()}
                       for step, counts in state["counts"].items()}
