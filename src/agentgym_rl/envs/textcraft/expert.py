"""`TextCraftExpert`: plans the whole craft from the current inventory every turn.

The plan (`plan`) works backwards from the goal: an item still missing is fetched when it
is a raw material, else made with the recipe that needs the fewest turns (counting one turn
per craft and per `get`), as many times as the amount needs; a tag ingredient (`planks`)
takes the member item already held, else the cheapest one (on a tie, one the goal's recipes
name anyway: oak planks for an oak fence's sticks). In the original order all `get`s come
first (each raw material once, in the total amount), then the crafts, ingredients before what
they make. In depth-first order each ingredient is fetched or made where the recipe needing it
is crafted, in that recipe's amount: more turns, but every number in an action is one a
crafting command shows (no sums over the tree), which a small model can copy.
The expert replies with the plan's first step, so it needs no memory between turns and
recovers from any state (e.g. after another policy's actions).

The expert solves every train and test item within the 20-turn limit (at most 20 turns: two
test banners take exactly 20; see `goals.BEYOND_HORIZON` for the goals that need more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .recipes import Ingredient, Recipe, RecipeBook, display

_INFINITE = math.inf


@dataclass(frozen=True)
class Step:
    """One planned action and the short reason the expert gives for it."""

    action: str
    thought: str


class _Planner:
    """Plans for one (goal, inventory); throw it away afterwards.

    While planning, `stock` is what the inventory will hold at this point of the plan
    (minus what is set aside for crafts already planned) and `gets` the raw materials planned
    so far; turn estimates use both, so that a surplus (4 planks from one craft) or a raw
    material fetched anyway is reused rather than made again another way.
    """

    def __init__(self, book: RecipeBook, inventory: dict[str, int], goal: str, depth_first: bool = False):
        self.book = book
        self.goal = goal
        self.depth_first = depth_first
        #: Items the recipes of the goal's tree name explicitly (preferred for tags).
        self.named = {i.name for recipe in book.tree(goal) for i in recipe.inputs if not i.is_tag}
        self.stock = dict(inventory)
        self.gets: dict[str, tuple[int, str]] = {}  # raw item -> (amount, what it is for)
        self.crafts: list[Step] = []  # depth-first: the gets too, in order
        self._costs: dict[tuple[str, int], float] = {}  # valid until stock or gets change

    # -- turn estimates --------------------------------------------------------------------
    def cost(self, item: str, amount: int, visiting: frozenset[str] = frozenset()) -> float:
        """Turns until the plan can set aside `amount` of `item` (what it holds counts)."""
        amount -= self.stock.get(item, 0)
        if amount <= 0:
            return 0
        if self.book.is_raw(item):
            return 0 if item in self.gets else 1  # one `get` fetches any amount (depth-first: gets stays empty)
        key = (item, amount)
        if key not in self._costs:
            if item in visiting:
                return _INFINITE  # a cycle (the recipe book has none; defensive)
            inner = visiting | {item}
            best = min((self._recipe_cost(r, amount, inner) for r in self.book.recipes.get(item, ())),
                       default=_INFINITE)
            if best == _INFINITE:
                return best  # maybe only because of `visiting`: not memoised
            self._costs[key] = best
        return self._costs[key]

    def _recipe_cost(self, recipe: Recipe, amount: int, visiting: frozenset[str]) -> float:
        batches = math.ceil(amount / recipe.count)
        return batches + sum(self._ingredient_cost(i, batches * i.count, visiting) for i in recipe.inputs)

    def _ingredient_cost(self, ingredient: Ingredient, amount: int, visiting: frozenset[str]) -> float:
        return min((self.cost(item, amount, visiting) for item in self._candidates(ingredient)), default=_INFINITE)

    def _candidates(self, ingredient: Ingredient) -> tuple[str, ...]:
        """The items that can stand for an ingredient."""
        return self.book.members(ingredient.name) if ingredient.is_tag else (ingredient.name,)

    def _best_recipe(self, item: str, amount: int) -> Recipe | None:
        options = [(self._recipe_cost(r, amount, frozenset({item})), k, r)
                   for k, r in enumerate(self.book.recipes.get(item, ()))]
        best = min(options, default=None, key=lambda option: option[:2])
        return None if best is None or best[0] == _INFINITE else best[2]

    def _choose(self, ingredient: Ingredient, amount: int) -> str | None:
        """The item to use for `amount` of `ingredient`: one held in full (the most held),
        else the cheapest to make up."""
        items = self._candidates(ingredient)
        held = [item for item in items if self.stock.get(item, 0) >= amount]
        if held:
            return max(held, key=lambda item: (self.stock[item], -items.index(item)))
        # Ties go to an item the goal's recipes name anyway (`oak planks` for the sticks of
        # an oak fence: its logs are fetched for the fence's own planks).
        options = [(self.cost(item, amount), item not in self.named, k) for k, item in enumerate(items)]
        best = min(options, default=None)
        return None if best is None or best[0] == _INFINITE else items[best[2]]

    # -- the plan ------------------------------------------------------------------------
    def plan(self) -> list[Step] | None:
        """The steps from the inventory to the goal, or None when it cannot be made."""
        goal = self.goal
        if not self._make(goal, 1, goal):  # the goal is always crafted, even if held
            return None
        fetches = [Step(f"get {amount} {display(item)}",
                        f"I need {amount} {display(item)} to craft {display(purpose)}.")
                   for item, (amount, purpose) in self.gets.items()]
        return fetches + self.crafts

    def _take(self, item: str, amount: int, purpose: str) -> bool:
        """Plan to have `amount` of `item` and set it aside (removed from `stock`)."""
        held = min(self.stock.get(item, 0), amount)
        if held:
            self.stock[item] -= held
            self._costs.clear()
        return held == amount or self._make(item, amount - held, purpose)

    def _make(self, item: str, amount: int, purpose: str) -> bool:
        """Plan to fetch or craft `amount` of `item` (set aside for `purpose`)."""
        self._costs.clear()
        if self.book.is_raw(item) and self.depth_first:
            self.crafts.append(Step(f"get {amount} {display(item)}",
                                    f"I need {amount} {display(item)} to craft {display(purpose)}."))
            return True
        if self.book.is_raw(item):
            total, first_purpose = self.gets.get(item, (0, purpose))
            self.gets[item] = (total + amount, first_purpose)
            return True
        recipe = self._best_recipe(item, amount)
        if recipe is None:
            return False
        batches = math.ceil(amount / recipe.count)
        used = []
        for ingredient in recipe.inputs:
            chosen = self._choose(ingredient, batches * ingredient.count)
            if chosen is None or not self._take(chosen, batches * ingredient.count, item):
                return False
            used.append(f"{ingredient.count} {display(chosen)}")
        action = f"craft {recipe.count} {display(item)} using {', '.join(used)}"
        if item == self.goal:
            thought = f"I have the ingredients for the {display(item)}, so I craft it."
        else:
            thought = f"I need {display(item)} to craft {display(purpose)}."
        self.crafts.extend([Step(action, thought)] * batches)
        self.stock[item] = self.stock.get(item, 0) + batches * recipe.count - amount
        self._costs.clear()
        return True


def plan(book: RecipeBook, goal: str, inventory: dict[str, int], depth_first: bool = False) -> list[Step] | None:
    """The expert's steps from `inventory` to crafting `goal` (None: impossible), gets first
    or depth-first (see the module's docstring)."""
    return _Planner(book, inventory, goal, depth_first).plan()


class TextCraftExpert:
    """Expert policy for `TextCraftEnv` (possibly wrapped): `act(env)` returns a ReAct reply.

    Stateless: it reads the goal, inventory and recipe book of `env.unwrapped` each turn, so
    one expert may play many environments at once; it plans in the order the environment's
    `expert_order` names.
    """

    def act(self, env) -> str:
        base = env.unwrapped
        steps = plan(base.book, base.goal, base.inventory, base.expert_order == "depth_first")
        if not steps:
            return f"Thought: I see no way to craft the {display(base.goal)}.\nAction: inventory"
        return f"Thought: {steps[0].thought}\nAction: {steps[0].action}"
