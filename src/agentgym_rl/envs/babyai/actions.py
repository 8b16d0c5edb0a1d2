"""BabyAI text actions: parsing, path planning and execution as minigrid primitive steps.

Actions (case-insensitive; "pick up" = "pickup", "gray" = "grey", a missing `<n>` means 1):

- `turn left`, `turn right`, `move forward`: one primitive step each.
- `pickup`: pick up the object directly in front; `drop`: drop the carried object in front;
  `toggle`: open/close the door in front (a locked door needs the key of its color) or open
  the box in front.
- `go to <color> <type> <n>`: walk the shortest path (breadth-first search over
  (cell, direction) states, turns and moves cost one step each) through cells the agent has
  seen that are free or open doors, to face the object from an adjacent cell.
- `pickup <color> <type> <n>`: `go to` it, then pick it up.
- `go through <color> door <n>` and `toggle and go through <color> door <n>` (the same
  command): `go to` the door, open it when closed (toggle), step into the doorway and, when the
  cell beyond is free, one more step, so the agent stands in the next room facing away from
  the door.
- `check available actions`: no step; the observation lists the actions.

Names and numbers refer to the objects of the current observation (see `render`). Every
primitive step counts toward minigrid's `max_steps`. A command that cannot be done takes no
step and returns an `Outcome` whose `error` says why.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from minigrid.core.actions import Actions
from minigrid.core.constants import COLOR_NAMES, DIR_TO_VEC
from minigrid.core.world_object import Wall

from .render import PICKABLE, View, VisibleObject, mark_seen, observe

#: Primitive names used in text, in minigrid's `Actions` order.
PRIMITIVE_TEXT = {
    Actions.left: "turn left",
    Actions.right: "turn right",
    Actions.forward: "move forward",
    Actions.pickup: "pickup",
    Actions.drop: "drop",
    Actions.toggle: "toggle",
}

_OBJ = rf"(?:the\s+)?({'|'.join(COLOR_NAMES)})\s+(door|key|ball|box)(?:\s+(\d+))?"
_PATTERNS = [
    (re.compile(r"(?:turn\s+)?left"), "turn left"),
    (re.compile(r"(?:turn\s+)?right"), "turn right"),
    (re.compile(r"(?:move|go)\s+forward|forward"), "move forward"),
    (re.compile(r"pick\s*up"), "pickup"),
    (re.compile(r"drop"), "drop"),
    (re.compile(r"toggle"), "toggle"),
    (re.compile(r"check\s+available\s+actions"), "check available actions"),
    (re.compile(rf"go\s+to\s+{_OBJ}"), "go to"),
    (re.compile(rf"pick\s*up\s+{_OBJ}"), "pickup"),
    (re.compile(rf"(?:toggle\s+and\s+)?go\s+through\s+{_OBJ}"), "go through"),
]


@dataclass(frozen=True)
class Command:
    """A parsed action: `verb` plus, for object actions, the object's color, type, number."""

    verb: str
    color: str | None = None
    obj_type: str | None = None
    number: int | None = None

    @property
    def label(self) -> str:
        return f"{self.color} {self.obj_type} {self.number}"


def parse_action(text: str | None) -> Command | None:
    """Parse one action (already taken out of a ReAct reply); None when not understood."""
    if not text:
        return None
    text = " ".join(text.lower().replace("gray", "grey").strip().strip("\"'`.").split())
    for pattern, verb in _PATTERNS:
        match = pattern.fullmatch(text)
        if match:
            if not match.groups():
                return Command(verb)
            color, obj_type, number = match.groups()
            return Command(verb, color, obj_type, int(number) if number else 1)
    return None


@dataclass
class Outcome:
    """What executing a command did.

    Attributes:
        reward: sum of minigrid rewards over the primitive steps.
        terminated, truncated: minigrid's flags after the last step.
        primitives: the minigrid actions taken, in order.
        error: why the command could not be done (no step was taken), else None.
    """

    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    primitives: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def plan_path(env, seen: np.ndarray, target: tuple[int, int]) -> list[int] | None:
    """Shortest primitive sequence (left/right/forward) that ends facing `target`.

    Search space: (x, y, direction); only seen cells that are empty or hold an open door
    are entered. Returns [] when already facing it, None when no path is known.
    """
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir))
    parents: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        x, y, d = state
        dx, dy = DIR_TO_VEC[d]
        if (x + dx, y + dy) == tuple(target):
            path = []
            while parents[state] is not None:
                state, action = parents[state]
                path.append(action)
            return path[::-1]
        nexts = [((x, y, (d - 1) % 4), Actions.left), ((x, y, (d + 1) % 4), Actions.right)]
        nx, ny = x + dx, y + dy
        if 0 <= nx < env.width and 0 <= ny < env.height and seen[nx, ny]:
            cell = env.grid.get(nx, ny)
            if cell is None or cell.can_overlap():
                nexts.insert(0, ((nx, ny, d), Actions.forward))
        for nxt, action in nexts:
            if nxt not in parents:
                parents[nxt] = (state, action)
                queue.append(nxt)
    return None


class _Runner:
    """Steps the minigrid env, keeping the outcome and the seen-cell mask up to date."""

    def __init__(self, env, seen: np.ndarray):
        self.env, self.seen, self.outcome = env, seen, Outcome()

    def run(self, actions: list[int]) -> bool:
        """Take `actions` until the episode ends; True when all were taken and it goes on."""
        for action in actions:
            if self.outcome.done:
                return False
            _, reward, terminated, truncated, _ = self.env.step(action)
            self.outcome.reward += float(reward)
            self.outcome.terminated = bool(terminated)
            self.outcome.truncated = bool(truncated)
            self.outcome.primitives.append(int(action))
            mark_seen(self.env, self.seen)
        return not self.outcome.done


def front_cell(env):
    """The cell in front of the agent (a wall beyond the grid's edge)."""
    x, y = (int(v) for v in env.front_pos)
    if 0 <= x < env.width and 0 <= y < env.height:
        return env.grid.get(x, y)
    return Wall()


def _fail(reason: str) -> Outcome:
    return Outcome(error=reason)


def _carrying_name(env) -> str:
    return f"{env.carrying.color} {env.carrying.type}"


def _has_key_for(env, door_color: str) -> bool:
    return env.carrying is not None and env.carrying.type == "key" and env.carrying.color == door_color


def _execute_primitive(verb: str, env, view: View, runner: _Runner) -> Outcome:
    front = front_cell(env)
    if verb == "turn left":
        runner.run([Actions.left])
    elif verb == "turn right":
        runner.run([Actions.right])
    elif verb == "move forward":
        if front is not None and not front.can_overlap():
            return _fail("the way forward is blocked")
        runner.run([Actions.forward])
    elif verb == "pickup":
        if env.carrying is not None:
            return _fail(f"you are already carrying a {_carrying_name(env)}")
        if front is None or front.type not in PICKABLE:
            return _fail("there is nothing to pick up in front of you")
        runner.run([Actions.pickup])
    elif verb == "drop":
        if env.carrying is None:
            return _fail("you are not carrying anything")
        if front is not None:
            return _fail("the cell in front of you is not empty")
        runner.run([Actions.drop])
    elif verb == "toggle":
        if front is None or front.type not in ("door", "box"):
            return _fail("there is no door or box in front of you")
        if front.type == "door" and front.is_locked and not _has_key_for(env, front.color):
            return _fail(f"the {front.color} door is locked and you do not carry a {front.color} key")
        runner.run([Actions.toggle])
    return runner.outcome


def _execute_on_object(command: Command, target: VisibleObject, env, runner: _Runner) -> Outcome:
    if command.verb == "pickup":
        if target.type not in PICKABLE:
            return _fail(f"the {target.label} cannot be picked up")
        if env.carrying is not None:
            return _fail(f"you are already carrying a {_carrying_name(env)}")
    if command.verb == "go through":
        if target.type != "door":
            return _fail(f"the {target.label} is not a door")
        if target.state == "locked" and not _has_key_for(env, target.color):
            return _fail(f"the {target.label} is locked and you do not carry a {target.color} key")
    path = plan_path(env, runner.seen, target.pos)
    if path is None:
        return _fail(f"you do not know a way to the {target.label}")
    if not runner.run(path):
        return runner.outcome
    if command.verb == "pickup":
        runner.run([Actions.pickup])
    elif command.verb == "go through":
        door = env.grid.get(*target.pos)
        if not door.is_open and not runner.run([Actions.toggle]):
            return runner.outcome
        if not runner.run([Actions.forward]):
            return runner.outcome
        beyond = front_cell(env)
        if beyond is None or beyond.can_overlap():
            runner.run([Actions.forward])
    return runner.outcome


def execute(command: Command | None, env, seen: np.ndarray) -> Outcome:
    """Execute `command` on the unwrapped minigrid `env`; `seen` is updated in place.

    Never raises for a bad command: the returned `Outcome.error` explains it instead.
    """
    if command is None:
        return _fail("that is not a valid action")
    runner = _Runner(env, seen)
    view = observe(env)
    if command.verb == "check available actions":
        return runner.outcome
    if command.color is None:
        return _execute_primitive(command.verb, env, view, runner)
    target = view.find(command.color, command.obj_type, command.number)
    if target is None:
        return _fail(f"there is no {command.label} in view")
    return _execute_on_object(command, target, env, runner)
