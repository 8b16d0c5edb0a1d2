"""`TextCraftEnv`: craft a Minecraft item from raw materials with text commands.

Item `i` crafts goal `i` of the depth-sorted goal list (see `goals`). The first observation
lists the crafting commands and the goal, as the original:

    Crafting commands:
    craft 1 blue dye using 1 lapis lazuli
    ...

    Goal: craft flint and steel.

Then each turn the agent sends one action (`get`, `craft`, `inventory`; see `crafting`) and
sees its result. Reward is 1 when the goal item is crafted, which terminates the episode;
every other step gives 0. The environment never truncates: the turn limit is the
`TurnLimit` wrapper's (20 in the registry, as AgentGym-RL trained TextCraft).

Nothing grows across resets: the recipe book is shared and immutable, and an episode holds
only its goal, commands and inventory.
"""

from __future__ import annotations

import json
import random
from typing import Any

from .. import snapshots
from ..base import EnvStateError, StepResult, TextEnv, parse_item_index
from ..parsing import extract_action
from .crafting import execute
from .goals import ENV_ID, crafting_commands, item_goal, split_indices
from .recipes import RecipeBook, display, load_recipe_book

EXPERT_ORDERS = ("gets_first", "depth_first")

INSTRUCTION = (
    "You craft Minecraft items in a text game. You are given crafting commands and a goal item. "
    "Each turn, do one action:\n"
    '- "get <count> <item>" fetches a raw material (an item no command makes), e.g. get 1 lapis lazuli;\n'
    '- "craft <count> <item> using <count> <item>, ..." crafts once with one of the crafting commands, '
    "e.g. craft 1 blue dye using 1 lapis lazuli; you must hold the ingredients. When a command names a "
    'kind of item, such as "planks", use one specific item of that kind for the whole count, '
    "e.g. craft 4 stick using 2 oak planks;\n"
    '- "inventory" shows what you hold.\n'
    "You succeed when you craft the goal item. Reply in exactly this format:\n"
    "Thought: <a short reason>\n"
    "Action: <one action>"
)


class TextCraftEnv(TextEnv):
    """TextCraft text environment (see the module docstring).

    Experts read `book` (the recipe book), `goal` (the goal item id) and `inventory` (a copy:
    item id -> count).
    """

    env_id = ENV_ID
    instruction = INSTRUCTION

    def __init__(self, variant: int = 0, expert_order: str = "gets_first", list_actions: bool = False) -> None:
        """Args:
            variant: 0 shows each item's crafting commands as the original does; another
                number draws other distractor recipes, in another order, for the same goals:
                more diverse demonstrations of the training items (evaluate with 0).
            expert_order: how `expert_action` orders its plan: "gets_first" (every raw
                material first, in the total amount) or "depth_first" (each ingredient where
                it is needed, in the amount a crafting command shows; `expert` module).
            list_actions: end each observation with the available actions (`available_actions`:
                the crafting commands, a `get` of each raw material they name, `inventory`), as
                BabyAI's do: a small instruct model that crafts without fetching anything
                (docs/RESULTS.md) is shown the `get`s it could write.
        """
        if not isinstance(variant, int) or variant < 0:
            raise ValueError(f"variant must be a non-negative integer; got {variant!r}")
        if expert_order not in EXPERT_ORDERS:
            raise ValueError(f"expert_order must be one of {', '.join(EXPERT_ORDERS)}; got {expert_order!r}")
        self.variant = variant
        self.expert_order = expert_order
        self.list_actions = list_actions
        self.book: RecipeBook = load_recipe_book()
        self._goal: str | None = None
        self._commands: list[str] = []
        self._inventory: dict[str, int] = {}
        self._info: dict[str, Any] = {}
        self._done = True

    # -- state read by experts -------------------------------------------------------------
    @property
    def goal(self) -> str | None:
        return self._goal

    @property
    def inventory(self) -> dict[str, int]:
        return dict(self._inventory)

    @property
    def commands(self) -> list[str]:
        return list(self._commands)

    # -- TextEnv API -----------------------------------------------------------------------
    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if item_id is None:
            index = random.Random(seed).choice(split_indices()["train"])
        else:
            index = parse_item_index(item_id, self.env_id)
        goal, depth = item_goal(index)
        self._goal = goal
        self._commands = crafting_commands(index, self.book, self.variant)
        self._inventory = {}
        self._done = False
        self._info = {
            "item_id": f"{self.env_id}_{index}",
            "goal": display(goal),
            "depth": depth,
            "category": f"depth {depth}",
        }
        observation = "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(self._commands), display(goal))
        return self._listed(observation), {**self._info, "state_key": self.state_key()}

    def step(self, action: str) -> StepResult:
        if self._goal is None:
            raise EnvStateError("call reset before step")
        if self._done:
            raise EnvStateError("the episode has ended; call reset")
        outcome = execute(self.book, self._inventory, extract_action(action or ""))
        success = outcome.crafted == self._goal
        self._done = success
        info = {**self._info, "success": success, "invalid_action": outcome.invalid, "state_key": self.state_key()}
        return self._listed(outcome.observation), float(success), success, False, info

    def _listed(self, observation: str) -> str:
        """`observation`, with `list_actions`, followed by the available actions."""
        if not self.list_actions:
            return observation
        return f"{observation}\nAvailable actions: {json.dumps(self.available_actions())}"

    def snapshot(self) -> bytes:
        """The goal, the crafting commands shown, the inventory and the episode's info."""
        if self._goal is None:
            raise EnvStateError("call reset before snapshot")
        return snapshots.dump(self.env_id, (self._goal, list(self._commands), dict(self._inventory), self._done,
                                            dict(self._info)))

    def restore(self, state: bytes) -> None:
        goal, commands, inventory, done, info = snapshots.load(self.env_id, state)
        self._goal, self._commands, self._inventory, self._done, self._info = \
            goal, list(commands), dict(inventory), done, dict(info)

    def state_key(self) -> str:
        """The true state as text: the inventory, item by item (the goal and the commands are the
        item's own). The step observation shows only what an action did, not the inventory, so
        equal observations need not be equal states (GiGPO's step groups)."""
        return ", ".join(f"{count} {item}" for item, count in sorted(self._inventory.items()) if count) or "empty"

    def expert_action(self) -> str | None:
        """The next step of a crafting plan from the current inventory (`expert.TextCraftExpert`)."""
        if self._goal is None:
            return None
        from .expert import TextCraftExpert

        return TextCraftExpert().act(self)

    def available_actions(self) -> list[str] | None:
        """The crafting commands as shown, a `get` for each raw material they name (in the
        amount of the first command naming it) and `inventory`. Crafting commands with a
        kind of item (`2 planks`) are listed as shown although they only work with a
        specific item: the list is what the agent was told, not a solution."""
        if self._goal is None:
            return None
        gets: dict[str, int] = {}
        for command in self._commands:
            for part in command.split(" using ", 1)[1].split(", "):
                count, name = part.split(" ", 1)
                item = name.replace(" ", "_")
                if self.book.is_raw(item) and item not in gets:
                    gets[item] = int(count)
        return [*self._commands, *(f"get {n} {display(item)}" for item, n in gets.items()), "inventory"]

    def close(self) -> None:
        self._goal = None
        self._commands = []
        self._inventory = {}
        self._done = True
