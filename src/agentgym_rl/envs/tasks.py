"""Task sets: which items make up a split, and the category of each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from ..config.sections import ItemChoice

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Task:
    """One task of an environment.

    Attributes:
        env_id: registered environment id, e.g. "babyai".
        index: the item index passed to `reset`.
        category: the reporting group (e.g. "GoTo").
    """

    env_id: str
    index: int
    category: str

    @property
    def item_id(self) -> str:
        return f"{self.env_id}_{self.index}"


ITEM_CHOICES = get_args(ItemChoice)


def choose_items(tasks: list[Task], count: int, how: str = "first") -> list[Task]:
    """`count` of `tasks`: the first ones ("first"), or ("stratified") one from each category in
    turn, categories in the order they first appear and items in split order within each, until
    `count` are taken; returned in split order. Deterministic: the same split gives the same items.

    Example: categories A A A B C C, count 4 -> A1 A2 B1 C1 ("first": A1 A2 A3 B1).
    """
    if how not in ITEM_CHOICES:
        raise ValueError(f"items are drawn {' or '.join(ITEM_CHOICES)}, not {how!r}")
    if how == "first" or count >= len(tasks):
        return tasks[:count]
    by_category: dict[str, list[int]] = {}
    for position, task in enumerate(tasks):
        by_category.setdefault(task.category, []).append(position)
    chosen: list[int] = []
    for depth in range(max(len(positions) for positions in by_category.values())):
        for positions in by_category.values():
            if depth < len(positions) and len(chosen) < count:
                chosen.append(positions[depth])
    return [tasks[position] for position in sorted(chosen)]

