"""Task sets: which items make up a split, and the category of each."""

from __future__ import annotations

from dataclasses import dataclass

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
