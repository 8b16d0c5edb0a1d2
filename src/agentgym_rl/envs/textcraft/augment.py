"""Renamed copies of TextCraft episodes, to train on more than the expert played.

An episode whose item names are renamed by one permutation throughout (crafting commands, goal,
actions, the environment's replies) reads as an episode of a recipe book with those items
renamed. The permutation keeps what a name tells the rules: raw materials are renamed among raw
materials, members of a tag among the members of the same tag (`oak planks` stays a kind of
`planks`), other craftable items among themselves; tags keep their names. A small model trained
on such copies cannot recall an item's recipe from its name; it has to read it in the commands.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from .recipes import RecipeBook, display, load_recipe_book


@functools.lru_cache(maxsize=1)
def _groups_and_pattern() -> tuple[tuple[tuple[str, ...], ...], re.Pattern]:
    """The groups of item ids renamed among themselves, and a pattern matching any item's name
    as text shows it (`oak planks`, or `minecraft:oak_planks`)."""
    book: RecipeBook = load_recipe_book()
    raw = sorted(item for item in book.items if book.is_raw(item))
    by_tag: dict[str, list[str]] = {}
    for item, tag in sorted(book.tag_of.items()):
        by_tag.setdefault(tag, []).append(item)
    members = set(book.tag_of)
    crafted = sorted(item for item in book.recipes if item not in members and item not in raw)
    groups = tuple(tuple(group) for group in (raw, crafted, *by_tag.values()) if len(group) > 1)
    names = sorted({item for group in groups for item in group}, key=len, reverse=True)  # longest first
    alternatives = "|".join(re.escape(display(name)) + "|" + re.escape(f"minecraft:{name}") for name in names)
    return groups, re.compile(rf"(?<![\w:])({alternatives})(?![\w])")


def rename_items(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """`messages` with every item name renamed by one random permutation within each group."""
    groups, pattern = _groups_and_pattern()
    renamed: dict[str, str] = {}
    for group in groups:
        shuffled = list(group)
        rng.shuffle(shuffled)
        for old, new in zip(group, shuffled):
            renamed[display(old)] = display(new)
            renamed[f"minecraft:{old}"] = f"minecraft:{new}"
    return [dict(message, content=pattern.sub(lambda match: renamed[match.group(1)], message["content"]))
            for message in messages]
