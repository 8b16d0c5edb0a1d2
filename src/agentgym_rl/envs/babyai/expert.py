"""The BabyAI expert (`EpisodeExpert`): minigrid's `BabyAIBot` mapped onto the text actions.

Each turn:

1. Take the bot kept from the previous turn, copied and moved to the env's real agent pose
   ("teleport"; see step 4), or, at the start of an episode or when the env is not in the
   state the expert expected, a new `_ResumingBot` on a copy of the current state.
2. Run a copy of the bot to the end of the mission: its primitive plan and the states along
   it.
3. Simulate every available text action on a copy of the env and score it by the plan state
   it lands nearest to: `index - distance`. The distance counts the moves and turns between
   the two agent poses (0 when both face the same object; up to 2 only while the bot is
   walking there), and only states with the same grid, carried object and instruction
   progress count. An action that completes the mission wins; ties go to the nearer landing,
   then to fewer primitive steps. One shortcut: when the bot walks somewhere only to drop
   what it carries, `drop` right here counts as that drop if the cell is harmless (next to
   no door, cuts nothing off) and the state is new this episode. When no action lands near
   the plan, the plan's first primitive is sent.
4. Keep the bot as it is at the chosen plan state, before it plans its next step.

Why not feed one bot every executed primitive? The bot then runs in "advising" mode and
plans to undo any step that differs from its own suggestion, while high-level actions often
reach the same state along another path. Why not a new bot every turn? Its choices depend on
where it stands (e.g. which way to turn), so consecutive bots undo each other.

The reply is ReAct text with a short templated thought.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from minigrid.core.actions import Actions
from minigrid.core.constants import DIR_TO_VEC
from minigrid.envs.babyai.core.verifier import AfterInstr, AndInstr, BeforeInstr, PutNextInstr, SeqInstr
from minigrid.utils.baby_ai_bot import BabyAIBot, DropSubgoal, GoNextToSubgoal, PickupSubgoal

from .actions import PRIMITIVE_TEXT, execute, parse_action
from .render import visible_cells

#: Longest bot plan computed per turn (primitive steps).
MAX_PLAN_STEPS = 300
#: Farthest a text action may land from a plan state (moves + turns) and still count.
MAX_POSE_DISTANCE = 2
_MOVES = (Actions.left, Actions.right, Actions.forward)


#: Subgoals one `replan` call may push before the bot counts as stuck.
_STACK_BUDGET = 2000


class _BotStuck(RuntimeError):
    """The bot kept pushing subgoals without choosing an action."""


class _BoundedStack(list):
    """The bot's subgoal stack, limited to `budget` pushes."""

    budget = _STACK_BUDGET

    def append(self, item):
        self.budget -= 1
        if self.budget < 0:
            raise _BotStuck("the bot is stuck in a planning loop")
        super().append(item)


class _ResumingBot(BabyAIBot):
    """A `BabyAIBot` that starts in the middle of an episode.

    It knows the cells seen so far (`seen`), skips the parts of the instruction the level's
    verifier already marked done, keeps carrying the object of an unfinished "put next to",
    and first drops anything else it carries when the rest of the plan picks something up.
    """

    def __init__(self, mission, seen):
        super().__init__(mission)  # builds the plan stack with `_process_instr` below
        self.stack = _BoundedStack(self.stack)
        self.vis_mask |= seen
        carrying = mission.unwrapped.carrying
        keeps = any(isinstance(goal, DropSubgoal) and goal.reason == "PutNext" for goal in self.stack)
        needs_hands = any(isinstance(goal, PickupSubgoal) for goal in self.stack)
        if carrying is not None and needs_hands and not keeps:
            try:
                drop_pos = self._find_drop_pos()
            except Exception:  # the bot's own search asserts in rare corners
                drop_pos = None
            if drop_pos is not None:
                self.stack.append(DropSubgoal(self))
                self.stack.append(GoNextToSubgoal(self, drop_pos))

    def _process_obs(self):
        """The base bot's: mark the cells in view as seen (its `vis_mask`, indexed [x, y]),
        with the visibility computed by `view_mask` instead of minigrid's `gen_obs_grid`."""
        level = self.mission.unwrapped
        for (x, y), _, _ in visible_cells(level):
            self.vis_mask[x, y] = True
        self.vis_mask[tuple(level.agent_pos)] = True

    def _breadth_first_search(self, initial_states, accept_fn, ignore_blockers):
        """The base bot's search, visiting the same states in the same order, with a queue read
        by index (the base pops with `queue = queue[1:]`, a copy of the queue per state
        visited): the same demonstrations, played ~10% faster."""
        self.bfs_counter += 1
        queue = [(state, None) for state in initial_states]
        grid = self.mission.unwrapped.grid
        previous_pos: dict = {}
        head = 0
        while head < len(queue):
            (i, j, di, dj), prev_pos = queue[head]
            head += 1
            if (i, j) in previous_pos:
                continue
            self.bfs_step_counter += 1
            cell = grid.get(i, j)
            previous_pos[(i, j)] = prev_pos
            if accept_fn((i, j), cell):
                path, pos = [], (i, j)
                while pos:
                    path.append(pos)
                    pos = previous_pos[pos]
                return path, (i, j), previous_pos
            if not self.vis_mask[i, j]:
                continue  # not seen yet: not expanded
            if cell is not None:
                if cell.type == "wall" or (cell.type == "door" and not cell.is_open):
                    continue
                if cell.type != "door" and not ignore_blockers:
                    continue
            # the cells reached without turning first
            for k, l in ((di, dj), (dj, di), (-dj, -di), (-di, -dj)):
                queue.append(((i + k, j + l, k, l), (i, j)))
        return None, None, previous_pos

    def replan(self, action_taken=None):
        # The base bot can cycle forever inside one `replan` (e.g. exploring towards a cell
        # it then considers reached); the stack budget turns that into an exception.
        self.stack.budget = _STACK_BUDGET
        return super().replan(action_taken)

    def _process_instr(self, instr):
        if isinstance(instr, AndInstr):
            parts = [(instr.instr_b, instr.b_done), (instr.instr_a, instr.a_done)]
        elif isinstance(instr, BeforeInstr):
            parts = [(instr.instr_b, False), (instr.instr_a, instr.a_done)]
        elif isinstance(instr, AfterInstr):
            parts = [(instr.instr_a, False), (instr.instr_b, instr.b_done)]
        elif isinstance(instr, PutNextInstr) and self._carries(instr.desc_move.obj_set):
            self.stack.append(DropSubgoal(self, reason="PutNext"))
            self.stack.append(GoNextToSubgoal(self, instr.desc_fixed, reason="PutNext"))
            return
        else:
            super()._process_instr(instr)
            return
        for part, done in parts:  # the later part goes first (bottom of the stack)
            if done != "success":
                self._process_instr(part)

    def _carries(self, objs) -> bool:
        carrying = self.mission.unwrapped.carrying
        return carrying is not None and any(obj is carrying for obj in objs)


def _progress(instr) -> tuple:
    """The done flags of a sequence instruction tree (which parts the verifier ticked)."""
    if isinstance(instr, SeqInstr):
        return (instr.a_done, instr.b_done, _progress(instr.instr_a), _progress(instr.instr_b))
    return ()


def state_key(env) -> tuple:
    """(carried object, every cell that is not a wall with its encoding, instruction progress):
    what must match, apart from the agent's pose. Keys are only compared within one level,
    whose walls never change, so leaving them out keeps the same equalities as encoding the
    whole grid, at a fraction of the cost (the plans compute a key at every step)."""
    carrying = (env.carrying.color, env.carrying.type) if env.carrying is not None else None
    cells = tuple((i, cell.encode()) for i, cell in enumerate(env.grid.grid)
                  if cell is not None and cell.type != "wall")
    return carrying, cells, _progress(env.instrs)


def pose(env) -> tuple[int, int, int, tuple[int, int] | None]:
    """(x, y, direction, the faced cell when it holds an object or door)."""
    front = env.grid.get(*env.front_pos)
    faced = None
    if front is not None and front.type != "wall":
        faced = (int(env.front_pos[0]), int(env.front_pos[1]))
    return int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir), faced


def pose_distance(env, a: tuple, b: tuple, limit: int) -> int | None:
    """Primitive steps (moves and turns over free cells) from pose `a` to pose `b` in
    `env`'s grid; 0 when both face the same object; None when more than `limit`."""
    if a[3] is not None and a[3] == b[3]:
        return 0
    turns = (a[2] - b[2]) % 4
    if abs(a[0] - b[0]) + abs(a[1] - b[1]) + (2 if turns == 2 else min(turns, 1)) > limit:
        return None  # a lower bound already exceeds the limit
    frontier, seen = [a[:3]], {a[:3]}
    for steps in range(limit + 1):
        if b[:3] in seen:
            return steps
        nxt = []
        for x, y, d in frontier:
            dx, dy = DIR_TO_VEC[d]
            options = [(x, y, (d - 1) % 4), (x, y, (d + 1) % 4)]
            cell = env.grid.get(x + dx, y + dy)
            if cell is None or cell.can_overlap():
                options.append((x + dx, y + dy, d))
            for option in options:
                if option not in seen:
                    seen.add(option)
                    nxt.append(option)
        frontier = nxt
    return None


def thought_for(action: str, env) -> str:
    """A short templated reason for `action` (a tiny model imitates these)."""
    command = parse_action(action)
    if command is None:
        return "I will look around."
    if command.color is not None:
        name = f"{command.color} {command.obj_type}"
        if command.verb == "go to":
            return f"I need to go to the {name}."
        if command.verb == "pickup":
            return f"I need to pick up the {name}."
        return f"I need to go through the {name}."
    front = env.grid.get(*env.front_pos)
    if command.verb == "drop" and env.carrying is not None:
        return f"I need to drop the {env.carrying.color} {env.carrying.type}."
    if command.verb == "toggle" and front is not None:
        verb = "close" if front.type == "door" and front.is_open else "open"
        return f"I need to {verb} the {front.color} {front.type}."
    if command.verb == "pickup" and front is not None:
        return f"I need to pick up the {front.color} {front.type}."
    return f"I need to {command.verb} to explore."


def _reachable(env, blocked: tuple[int, int] | None = None) -> set[tuple[int, int]]:
    """Cells reachable from the agent through free cells and doors (any state); object
    cells are reached but not crossed. `blocked` is treated as holding an object."""
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]))
    seen, queue = {start}, deque([start])
    while queue:
        x, y = queue.popleft()
        cell = env.grid.get(x, y)
        if (x, y) != start and ((x, y) == blocked or (cell is not None and cell.type != "door")):
            continue
        for nxt in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
            if nxt in seen or not (0 <= nxt[0] < env.width and 0 <= nxt[1] < env.height):
                continue
            nxt_cell = env.grid.get(*nxt)
            if nxt_cell is None or nxt_cell.type != "wall":
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _harmless_drop_cell(env, cell: tuple[int, int]) -> bool:
    """Dropping into `cell` blocks no doorway and cuts nothing off."""
    x, y = cell
    for nxt in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
        neighbour = env.grid.get(*nxt)
        if neighbour is not None and neighbour.type == "door":
            return False
    return _reachable(env, blocked=cell) == _reachable(env)


def _must_place(instr, carrying) -> bool:
    """Whether an unfinished "put next to" of `instr` moves the object `carrying`."""
    if carrying is None:
        return False
    if isinstance(instr, SeqInstr):
        return (instr.a_done != "success" and _must_place(instr.instr_a, carrying)) or (
            instr.b_done != "success" and _must_place(instr.instr_b, carrying)
        )
    return isinstance(instr, PutNextInstr) and any(obj is carrying for obj in instr.desc_move.obj_set)


def _early_drop_progress(env, plan: _Plan) -> int | None:
    """When the bot walks to a cell to drop what it carries, the plan state index reached by
    dropping right here instead (if the cell in front is empty and harmless), else None."""
    steps = 0
    while steps < len(plan.actions) and plan.actions[steps] in _MOVES:
        steps += 1
    if steps == 0 or steps >= len(plan.actions) or plan.actions[steps] != Actions.drop:
        return None
    front = (int(env.front_pos[0]), int(env.front_pos[1]))
    if _must_place(env.instrs, env.carrying):
        return None  # this drop is the mission's "put next to"
    if env.carrying is None or env.grid.get(*front) is not None or not _harmless_drop_cell(env, front):
        return None
    return steps + 1


# What no step of a level changes, shared between a level and its copies (a deep copy of the
# walls alone was most of the expert's time on the larger levels).
_SHARED_ATTRIBUTES = ("observation_space", "action_space", "spec", "actions")


def copy_level(obj: Any, level: Any = None) -> Any:
    """`copy.deepcopy(obj)` for a minigrid level (or objects holding `level`) to simulate on:
    its walls and spaces are shared with the copy instead of duplicated, and the copy's
    `step` returns no observation (nothing reads it; building it cost a third of the time)."""
    level = obj if level is None else level
    memo: dict[int, Any] = {}
    for cell in level.grid.grid:
        if cell is not None and cell.type == "wall":
            memo[id(cell)] = cell
    for name in _SHARED_ATTRIBUTES:
        value = getattr(level, name, None)
        if value is not None:
            memo[id(value)] = value
    copied = copy.deepcopy(obj, memo)
    memo[id(level)].gen_obs = _no_observation
    return copied


def _no_observation() -> None:
    return None


def _copy_progress(source, target) -> None:
    """Copy the done flags of a sequence instruction tree (the verifier's progress)."""
    if isinstance(source, SeqInstr) and isinstance(target, SeqInstr):
        target.a_done, target.b_done = source.a_done, source.b_done
        _copy_progress(source.instr_a, target.instr_a)
        _copy_progress(source.instr_b, target.instr_b)


def _replan(bot: BabyAIBot, action: int | None) -> int | None:
    """The bot's next action, or None when it gives up (it asserts in a few corner cases)."""
    try:
        return bot.replan(action)
    except Exception:
        return None


@dataclass
class _Snapshot:
    """A bot and its level stopped at a plan state, before planning from it.

    `last_action` is the primitive that led there (the bot's `replan` argument); `episode`,
    `history_len`, `key` and `pose` describe the env state expected next turn.
    """

    bot: BabyAIBot
    level: Any
    last_action: int | None
    episode: tuple[int, int]
    history_len: int
    key: tuple
    pose: tuple


@dataclass
class _Plan:
    """The bot's plan: `actions[i]` leads from state i to state i + 1."""

    actions: list[int] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)  # state_key of states 1.., or "success"
    poses: list[tuple | None] = field(default_factory=list)


class EpisodeExpert:
    """The expert's memory and planning for one `BabyAIEnv`, which keeps one
    (`BabyAIEnv.expert_action`): `act(env)` returns a ReAct reply."""

    def __init__(self) -> None:
        self._snapshot: _Snapshot | None = None
        self._episode: tuple[int, int] | None = None
        self._visited: set = set()

    def act(self, env) -> str:
        base = env.unwrapped
        if self._episode != (id(base), base.episode):
            self._episode, self._visited = (id(base), base.episode), set()
        self._visited.add(state_key(base.minigrid_env))
        start = self._resume(base)
        plan = self._plan(start)
        if not plan.actions and start.last_action is not None:
            start = self._fresh(base)  # the kept bot is stuck: start over from here
            plan = self._plan(start)
        action, index, n_steps, end = self._choose(base, plan, self._visited)
        if action is None:
            self._snapshot = None
            action = "turn left"
        else:
            self._keep(base, start, index, n_steps, end)
        return f"Thought: {thought_for(action, base.minigrid_env)}\nAction: {action}"

    # -- the bot -------------------------------------------------------------------------
    @staticmethod
    def _fresh(base) -> _Snapshot:
        real = base.minigrid_env
        level = copy_level(real)
        bot = _ResumingBot(level, base.seen_mask)
        return _Snapshot(bot, level, None, (id(base), base.episode), len(base.primitive_history),
                         state_key(real), pose(real))

    def _resume(self, base) -> _Snapshot:
        """A copy of the kept bot moved to the env's real state, or a fresh bot."""
        real = base.minigrid_env
        kept = self._snapshot
        if (
            kept is None
            or kept.episode != (id(base), base.episode)
            or kept.history_len != len(base.primitive_history)
            or kept.pose != pose(real)
            or kept.key != state_key(real)
        ):
            return self._fresh(base)
        bot, level = copy_level((kept.bot, kept.level), kept.level)
        level.agent_pos = tuple(real.agent_pos)
        level.agent_dir = real.agent_dir
        level.step_count = real.step_count
        _copy_progress(real.instrs, level.instrs)
        bot.vis_mask |= base.seen_mask
        return _Snapshot(bot, level, kept.last_action, kept.episode, kept.history_len, kept.key, kept.pose)

    @staticmethod
    def _plan(start: _Snapshot) -> _Plan:
        """Run a copy of the bot to the end of the mission."""
        bot, level = copy_level((start.bot, start.level), start.level)
        plan = _Plan()
        action = _replan(bot, start.last_action)
        while action is not None and action != Actions.done and len(plan.actions) < MAX_PLAN_STEPS:
            _, reward, terminated, truncated, _ = level.step(action)
            plan.actions.append(int(action))
            if terminated:
                plan.keys.append("success" if reward > 0 else "failure")
                plan.poses.append(None)
                break
            plan.keys.append(state_key(level))
            plan.poses.append(pose(level))
            if truncated:
                break
            action = _replan(bot, action)
        return plan

    def _keep(self, base, start: _Snapshot, index: int | None, n_steps: int, end: tuple) -> None:
        """Keep the bot stopped at plan state `index`; `end` is the (key, pose) expected.

        `index` None: the action leaves the plan; a new bot starts next turn."""
        if index is None:
            self._snapshot = None
            return
        bot, level = copy_level((start.bot, start.level), start.level)
        last = start.last_action
        for _ in range(index):
            action = _replan(bot, last)
            if action is None:
                self._snapshot = None
                return
            level.step(action)
            last = action
        self._snapshot = _Snapshot(bot, level, last, start.episode,
                                   len(base.primitive_history) + n_steps, end[0], end[1])

    # -- the text action -----------------------------------------------------------------
    @staticmethod
    def _choose(base, plan: _Plan, visited: set) -> tuple[str | None, int | None, int, tuple]:
        """(action, plan state index, primitive steps, (key, pose) at the end) of the best
        available action; `visited` holds the state keys met so far this episode."""
        by_key: dict[Any, list[int]] = {}
        for index, key in enumerate(plan.keys):
            by_key.setdefault(key, []).append(index)
        early_drop = _early_drop_progress(base.minigrid_env, plan)
        best, best_score = None, None
        for action in base.available_actions():
            command = parse_action(action)
            if command is None or command.verb == "check available actions":
                continue
            level = copy_level(base.minigrid_env)
            outcome = execute(command, level, base.seen_mask)
            if outcome.error is not None or not outcome.primitives:
                continue
            if (
                command.verb == "drop"
                and early_drop is not None
                and state_key(level) not in by_key
                and state_key(level) not in visited  # e.g. dropping a key just picked up
            ):
                # Drop here instead of walking to the bot's drop cell; the bot is rebuilt
                # from the new state next turn.
                index, progress, neg_distance, end = None, early_drop, -1, (None, None)
            elif outcome.terminated:
                if outcome.reward <= 0 or "success" not in by_key:
                    continue
                index, progress, end = by_key["success"][0], len(plan.keys) + 1, (None, None)
                neg_distance = 0
            else:
                key, where = state_key(level), pose(level)
                options = []
                for i in by_key.get(key, []):
                    # Landing near (not on) a plan state only counts while the bot walks
                    # there: its next step is a move or turn, not an action on a cell.
                    walking = i + 1 < len(plan.actions) and plan.actions[i + 1] in _MOVES
                    distance = pose_distance(level, where, plan.poses[i], MAX_POSE_DISTANCE if walking else 0)
                    if distance is not None:
                        options.append((i + 1 - distance, -distance, i))
                if not options:
                    continue
                progress, neg_distance, index = max(options)
                index, end = index + 1, (key, where)
            score = (progress, neg_distance, -len(outcome.primitives))
            if progress > 0 and (best_score is None or score > best_score):
                best, best_score = (action, index, len(outcome.primitives), end), score
        if best is None and plan.actions and plan.actions[0] in PRIMITIVE_TEXT:
            # e.g. a bare `pickup` (not listed, but understood) or no listed action fits
            end = (plan.keys[0], plan.poses[0])
            return PRIMITIVE_TEXT[plan.actions[0]], 1, 1, end
        return best if best is not None else (None, 0, 0, (None, None))
