"""TextCraft items: which goal an item index crafts, its crafting commands, and the splits.

Item mapping: every craftable item of the recipe book, sorted by (crafting depth, name),
is one goal; item index `i` crafts goal `i` (544 items: depth 1/2/3/4 = 125/291/117/11).
The original sorted the same goals by depth only, in `os.listdir` order, which differs
between machines; the name order makes item ids stable.

Crafting commands of an item: every recipe that can take part in crafting the goal (all
alternatives, down to raw materials), plus up to 10 distractors: recipes that use one of
those ingredients for something else (as the original: up to 10 uses sampled per
ingredient, then 10 of those). Sampling and the shuffled order come from
`random.Random(index)` over sorted lists, so an item always shows the same commands.

Splits (sizes and depth mix of the original: test 100 = depth 1/2/3/4 31/41/25/3, train 374):

1. Goals listed in `BEYOND_HORIZON` are left out: no plan crafts them within the 20-turn
   limit (the expert needs 23-48 turns: six colored wool crafts per banner, nine nuggets per
   iron ingot). Left: 125/291/109/6 items.
2. Test: in each depth group (sorted by name), `TEST_PER_DEPTH[d]` items at evenly spread
   positions (`_spread`).
3. Train: 374 of the remaining items, shared among the depths in proportion to what is left
   (largest remainder: 81/217/73/3), evenly spread within each group. The other 57 items
   are in no split (still playable by index).
4. Each split is ordered so that every prefix has about the split's depth mix (item k of
   n in its depth group sorts at (k + 0.5) / n), so `--episodes 20` is a fair sample.

Categories are "depth 1" .. "depth 4".
"""

from __future__ import annotations

import functools
import random

from ..tasks import Task
from .recipes import RecipeBook, load_recipe_book

ENV_ID = "textcraft"
DEPTHS = (1, 2, 3, 4)
CATEGORIES = tuple(f"depth {d}" for d in DEPTHS)
TEST_PER_DEPTH = {1: 31, 2: 41, 3: 25, 4: 3}
NUM_TRAIN = 374
MAX_DISTRACTORS = 10
#: Goals no plan crafts within 20 turns (the expert's shortest plans: 23-48 turns).
BEYOND_HORIZON = frozenset({
    "anvil", "black_banner", "blue_banner", "brown_banner", "light_blue_banner", "light_gray_banner",
    "netherite_block", "orange_banner", "cyan_banner", "gray_banner", "lime_banner", "lodestone",
    "purple_banner",
})


@functools.lru_cache(maxsize=1)
def goal_list() -> tuple[tuple[str, int], ...]:
    """(goal item, depth) of every item index."""
    return tuple(load_recipe_book().goals())


def num_items() -> int:
    return len(goal_list())


def item_goal(index: int) -> tuple[str, int]:
    """The goal item and its crafting depth of item `index`."""
    goals = goal_list()
    if not 0 <= index < len(goals):
        raise ValueError(f"textcraft item index must be in [0, {len(goals)}), got {index}")
    return goals[index]


def crafting_commands(index: int, book: RecipeBook | None = None, variant: int = 0) -> list[str]:
    """The crafting commands shown for item `index` (needed recipes and distractors); a
    `variant` other than 0 draws another set of distractors in another order for the same goal."""
    book = book or load_recipe_book()
    goal, _ = item_goal(index)
    rng = random.Random(index if variant == 0 else f"{index}/{variant}")
    needed = sorted({recipe.text for recipe in book.tree(goal)})
    ingredients = sorted({i.name for recipe in book.tree(goal) for i in recipe.inputs})
    candidates: set[str] = set()
    for name in ingredients:
        uses = [recipe.text for recipe in book.uses(name)]
        candidates.update(rng.sample(uses, min(len(uses), MAX_DISTRACTORS)))
    distractors = sorted(candidates.difference(needed))
    commands = needed + rng.sample(distractors, min(len(distractors), MAX_DISTRACTORS))
    rng.shuffle(commands)
    return commands


def _spread(size: int, count: int) -> list[int]:
    """`count` positions spread evenly over `range(size)` (the middle of equal slices)."""
    return [int((j + 0.5) * size / count) for j in range(count)]


def _largest_remainder(total: int, weights: dict[int, int]) -> dict[int, int]:
    """Share `total` in proportion to `weights` (Hamilton's method; ties to lower keys)."""
    whole = sum(weights.values())
    exact = {k: total * w / whole for k, w in weights.items()}
    shares = {k: int(v) for k, v in exact.items()}
    by_remainder = sorted(weights, key=lambda k: (-(exact[k] - shares[k]), k))
    for k in by_remainder[: total - sum(shares.values())]:
        shares[k] += 1
    return shares


def _interleave(groups: dict[int, list[int]]) -> list[int]:
    """Merge the depth groups so that every prefix has about the overall mix."""
    keyed = [((k + 0.5) / len(members), depth, index)
             for depth, members in groups.items() for k, index in enumerate(members)]
    return [index for *_, index in sorted(keyed)]


@functools.lru_cache(maxsize=1)
def split_indices() -> dict[str, tuple[int, ...]]:
    """The item indices of "train" and "test" (see the module docstring)."""
    by_depth: dict[int, list[int]] = {d: [] for d in DEPTHS}
    for index, (goal, depth) in enumerate(goal_list()):
        if goal not in BEYOND_HORIZON:
            by_depth[depth].append(index)
    test = {d: [members[p] for p in _spread(len(members), TEST_PER_DEPTH[d])] for d, members in by_depth.items()}
    rest = {d: [i for i in members if i not in test[d]] for d, members in by_depth.items()}
    shares = _largest_remainder(NUM_TRAIN, {d: len(members) for d, members in rest.items()})
    train = {d: [members[p] for p in _spread(len(members), shares[d])] for d, members in rest.items()}
    return {"train": tuple(_interleave(train)), "test": tuple(_interleave(test))}


def textcraft_tasks(split: str) -> list[Task]:
    """The tasks of a split, category "depth <d>"."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; choose 'train' or 'test'")
    return [Task(ENV_ID, index, f"depth {item_goal(index)[1]}") for index in split_indices()[split]]
