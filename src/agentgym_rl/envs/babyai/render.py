"""Text rendering of what the BabyAI agent sees.

Only the agent's 7x7 egocentric view is described (minigrid's `gen_obs_grid`, which hides
cells behind walls and closed doors). Positions are relative to the agent: "2 steps in front
of you and 1 steps to your right"; 0 steps in front means beside the agent.

Objects are sorted by distance (steps ahead + steps sideways), then by name, then by
position, and numbered per color and type in that order: "red ball 1" is the nearest red
ball. The number is the `<n>` of the actions (`go to red ball 1`), so it refers to the
current observation only. Example:

    Your goal: go to the red ball
    You can see: a red ball 1 2 steps in front of you and 1 steps to your right; a grey closed door 1 3 steps in front of you and 2 steps to your left. You are facing a wall 3 steps away. You are not carrying anything.
    Available actions: ["turn left", "turn right", "move forward", "go to red ball 1", ...]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

import numpy as np

#: Object types the agent can pick up.
PICKABLE = ("ball", "key", "box")
#: Object types described in observations (walls are described separately).
DESCRIBED = ("door", "key", "ball", "box")


@dataclass(frozen=True)
class VisibleObject:
    """One object in view.

    Attributes:
        color, type: as in minigrid ("red", "ball").
        number: 1, 2, ... among visible objects of this color and type.
        pos: absolute grid cell (x, y).
        front: steps in front of the agent (0 = beside it).
        right: steps to the right of the agent (negative = to the left).
        state: "open", "closed" or "locked" for doors, else None.
    """

    color: str
    type: str
    number: int
    pos: tuple[int, int]
    front: int
    right: int
    state: str | None = None

    @property
    def label(self) -> str:
        """The name actions use: "red ball 1", "grey door 2"."""
        return f"{self.color} {self.type} {self.number}"

    @property
    def described(self) -> str:
        """The name observations use (doors carry their state): "grey closed door 1"."""
        if self.state:
            return f"{self.color} {self.state} {self.type} {self.number}"
        return self.label


@dataclass(frozen=True)
class View:
    """Everything the text observation and the action list are built from.

    Attributes:
        mission: the goal sentence.
        objects: visible objects in observation order.
        ahead: what is first straight ahead: "a wall", an object's `described` name, or None
            when the visible line ahead is empty.
        ahead_distance: steps to `ahead` (or the number of empty visible cells ahead).
        front_object: the object in the cell directly in front, if any.
        carrying: (color, type) of the carried object, or None.
    """

    mission: str
    objects: tuple[VisibleObject, ...]
    ahead: str | None
    ahead_distance: int
    front_object: VisibleObject | None
    carrying: tuple[str, str] | None

    def find(self, color: str, obj_type: str, number: int) -> VisibleObject | None:
        for obj in self.objects:
            if (obj.color, obj.type, obj.number) == (color, obj_type, number):
                return obj
        return None


def door_state(cell) -> str:
    if cell.is_open:
        return "open"
    return "locked" if cell.is_locked else "closed"


def view_mask(env) -> np.ndarray:
    """The visibility mask of minigrid's `env.gen_obs_grid()`, shape (view, view), indexed
    [column from the left, row from the farthest], without building the view's grid.

    The same sweep as minigrid's `Grid.process_vis`, over the cells' opacity only: minigrid
    slices and rotates a copy of the view (new grid objects each time) first, which was most
    of the time the expert's plans and every observation spent on seeing. `env` is an
    unwrapped minigrid env; `test_babyai_view.py` checks the two agree."""
    size = env.agent_view_size
    if env.see_through_walls:
        return np.ones((size, size), dtype=bool)
    ax, ay = env.agent_pos
    fx, fy = env.dir_vec
    rx, ry = env.right_vec
    width, height, cells = env.width, env.height, env.grid.grid
    # opaque[i][j]: view cell (i, j) hides what is behind it; outside the level is a wall.
    opaque = [[True] * size for _ in range(size)]
    for j in range(size):
        front = size - 1 - j
        for i in range(size):
            right = i - size // 2
            x, y = ax + front * fx + right * rx, ay + front * fy + right * ry
            if 0 <= x < width and 0 <= y < height:
                cell = cells[y * width + x]
                opaque[i][j] = cell is not None and not cell.see_behind()
    mask = [[False] * size for _ in range(size)]
    mask[size // 2][size - 1] = True
    for j in reversed(range(size)):
        for i in range(size - 1):
            if mask[i][j] and not opaque[i][j]:
                mask[i + 1][j] = True
                if j > 0:
                    mask[i + 1][j - 1] = mask[i][j - 1] = True
        for i in reversed(range(1, size)):
            if mask[i][j] and not opaque[i][j]:
                mask[i - 1][j] = True
                if j > 0:
                    mask[i - 1][j - 1] = mask[i][j - 1] = True
    return np.array(mask, dtype=bool)


def visible_cells(env) -> Iterator[tuple[tuple[int, int], int, int]]:
    """Yield (absolute cell, steps in front, steps to the right) of every cell in view.

    The agent's own cell is left out. `env` is an unwrapped minigrid env.
    """
    vis_mask = view_mask(env)
    size = env.agent_view_size
    ax, ay = env.agent_pos
    fx, fy = env.dir_vec
    rx, ry = env.right_vec
    for vx in range(size):
        for vy in range(size):
            if not vis_mask[vx, vy]:
                continue
            front, right = size - 1 - vy, vx - size // 2
            if front == 0 and right == 0:
                continue
            x, y = ax + front * fx + right * rx, ay + front * fy + right * ry
            if 0 <= x < env.width and 0 <= y < env.height:
                yield (int(x), int(y)), front, right


def mark_seen(env, seen: np.ndarray) -> None:
    """Set `seen[x, y]` for every cell in view and the agent's cell (in place)."""
    seen[tuple(env.agent_pos)] = True
    for pos, _, _ in visible_cells(env):
        seen[pos] = True


def observe(env) -> View:
    """Build the `View` of an unwrapped minigrid BabyAI env."""
    found = []
    visible = {}
    for pos, front, right in visible_cells(env):
        visible[(front, right)] = pos
        cell = env.grid.get(*pos)
        if cell is not None and cell.type in DESCRIBED:
            found.append((front + abs(right), cell.color, cell.type, front, right, pos, cell))
    found.sort(key=lambda item: item[:5])
    counts: dict[tuple[str, str], int] = {}
    objects = []
    by_pos = {}
    for _, color, obj_type, front, right, pos, cell in found:
        counts[(color, obj_type)] = counts.get((color, obj_type), 0) + 1
        state = door_state(cell) if obj_type == "door" else None
        obj = VisibleObject(color, obj_type, counts[(color, obj_type)], pos, front, right, state)
        objects.append(obj)
        by_pos[pos] = obj

    ahead, distance = None, 0
    for step in range(1, env.agent_view_size):
        pos = visible.get((step, 0))
        if pos is None:
            break
        distance = step
        cell = env.grid.get(*pos)
        if cell is None:
            continue
        ahead = by_pos[pos].described if pos in by_pos else f"a {cell.type}"
        break

    front_pos = tuple(int(v) for v in env.front_pos)
    carrying = (env.carrying.color, env.carrying.type) if env.carrying is not None else None
    return View(
        mission=env.mission,
        objects=tuple(objects),
        ahead=ahead,
        ahead_distance=distance,
        front_object=by_pos.get(front_pos),
        carrying=carrying,
    )


def available_actions(view: View) -> list[str]:
    """The actions that make sense in `view` (see the module docstring of `actions`)."""
    actions = ["turn left", "turn right", "move forward"]
    if view.front_object is not None and view.front_object.type in ("door", "box"):
        actions.append("toggle")
    if view.carrying is not None:
        actions.append("drop")
    for obj in view.objects:
        actions.append(f"go to {obj.label}")
        if obj.type in PICKABLE and view.carrying is None:
            actions.append(f"pickup {obj.label}")
        if obj.type == "door":
            verb = "go through" if obj.state == "open" else "toggle and go through"
            actions.append(f"{verb} {obj.label}")
    actions.append("check available actions")
    return actions


def _position(obj: VisibleObject) -> str:
    parts = []
    if obj.front:
        parts.append(f"{obj.front} steps in front of you")
    if obj.right:
        side = "right" if obj.right > 0 else "left"
        parts.append(f"{abs(obj.right)} steps to your {side}")
    return " and ".join(parts)


def describe(view: View, list_actions: bool = True) -> str:
    """The observation text: goal, objects in view, what is ahead, inventory, and (unless
    `list_actions` is False) the available actions."""
    if view.objects:
        listed = "; ".join(f"a {obj.described} {_position(obj)}" for obj in view.objects)
        seen = f"You can see: {listed}."
    else:
        seen = "You can see no objects."
    if view.ahead is None:
        ahead = f"The way ahead is clear for {view.ahead_distance} steps."
    elif view.ahead == "a wall":
        ahead = f"You are facing a wall {view.ahead_distance} steps away."
    else:
        ahead = f"You are facing the {view.ahead}, {view.ahead_distance} steps away."
    if view.carrying is None:
        carrying = "You are not carrying anything."
    else:
        carrying = f"You are carrying a {view.carrying[0]} {view.carrying[1]}."
    text = f"Your goal: {view.mission}\n{seen} {ahead} {carrying}"
    if list_actions:
        text += f"\nAvailable actions: {json.dumps(available_actions(view))}"
    return text
