"""`SciWorldEnv`: ScienceWorld's elementary-science tasks as a text game.

Item `i` is the i-th (task, variation) pair of `items.TASKS` (see `items`). `reset` loads
it and plays `look around`; the first observation is the task description, a newline and
what the agent sees, as in the original AgentGym server. Each `step` sends one command to
the simulator (`open door to kitchen`, `focus on lead`, `use thermometer on lead`, ...).

Rewards (`reward=` in the constructor). The simulator scores an episode 0-100 by sub-goals
and sets it to -100 when the task is failed irreversibly (e.g. focusing on the wrong thing).
Each step's reward is the change of:

- "score" (default): the normalised score `max(score, 0) / 100`;
- "success": 1 when the task is completed with score 100, else 0;
- "raw": the raw score, as the simulator's own reward (the original trained on it).

Rewards are only for what the agent did: a sub-goal met from the start (such as being in the
right room) scores on the reset's `look around` and is never paid, and an action the
simulator rejects earns 0. So an episode's "score" rewards sum to its final normalised score
less the starting one.

Why "score" by default: success is rare on SciWorld (even large models complete few tasks),
and a group of samples that all score 0 gives GRPO nothing to learn from; partial credit for
sub-goals does. On the 0-1 scale of the other environments' rewards, advantage
normalisation and mixed-environment batches behave alike, and clipping at 0 keeps the -100
of a fatal mistake from dwarfing everything else (it still costs all credit earned so far).
`info` always carries "score" (the simulator's, -100..100) and "success".

Episodes terminate when the simulator says the task is over (completed or failed); there
is no step limit inside (wrap with `TurnLimit`, as `registry.make(max_turns=...)` does).

Invalid commands are answered, never raised: the simulator's own message ("No known action
matches that input.", "The door is not open.", ...) with info["invalid_action"] True. When a
command names an object ambiguously the simulator lists the candidates by number; the agent
may answer with the number, and any other command cancels the question and runs as usual.

One JVM per env (see `simulator`), started on the first reset and reused by later ones.
If it dies, the next simulator call starts a new one and replays the episode's commands
(the simulator is deterministic here), so the episode goes on; if the replay fails or ends
elsewhere, `step` raises `SimulatorDied`, which the rollout engine records as the episode's
error (ARCHITECTURE.md, decision 6).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any, TypeVar

from py4j.protocol import Py4JError, Py4JJavaError

from .. import snapshots
from ..base import EnvStateError, StepResult, TextEnv, parse_item_index
from ..parsing import extract_action
from .items import SciTask, item_task, sciworld_tasks
from .simulator import Simulator, SimulatorDied, is_connection_error

REWARDS = ("score", "success", "raw")
#: ScienceWorld's simplifications ("easy" = all of them).
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")

#: Action templates, as listed to the agent (and by `available_actions`).
ACTION_TEMPLATES = (
    "look around", "look at OBJ", "look in OBJ", "go to LOC", "open OBJ", "close OBJ",
    "pick up OBJ", "put down OBJ", "move OBJ to OBJ", "pour OBJ into OBJ", "dunk OBJ into OBJ",
    "mix OBJ", "activate OBJ", "deactivate OBJ", "connect OBJ to OBJ", "disconnect OBJ",
    "use OBJ on OBJ", "read OBJ", "eat OBJ", "flush OBJ", "focus on OBJ", "wait", "wait1",
    "inventory", "task",
)

INSTRUCTION = (
    "You are an agent in ScienceWorld, a simulated house with a kitchen, workshop, greenhouse "
    "and more, where you carry out elementary science experiments. Each turn you see what "
    "your last action did; the first observation states your task. Useful actions: "
    + ", ".join(ACTION_TEMPLATES)
    + ". OBJ and LOC name things and places as the observations name them. "
    "`focus on OBJ` declares the object your task is about: focusing on the wrong one fails "
    "the task. `wait` lets 10 time steps pass, `wait1` one. Reply in exactly this format:\n"
    "Thought: <a short reason>\n"
    "Action: <one action>"
)

#: Phrases of the simulator's answers to commands it could not parse or carry out.
_FAILURE = re.compile(
    r"no known action matches|unknown action|ambiguous request|i'm not sure|"
    r"it'?s not clear how|can't|cannot|is not (?:moveable|movable|openable|open|closeable|"
    r"a container|edible|something)|isn't open|is already|already (?:appears|connected)|"
    r"does not (?:appear|contain)|nothing to pour|appears broken|<error",
    re.IGNORECASE,
)
_AMBIGUOUS = "Ambiguous request"
#: The numbered choices of an ambiguous request ("0:\tlook at door between ...").
_CHOICE = re.compile(r"^(\d+):\t", re.MULTILINE)

T = TypeVar("T")


def is_failure_message(observation: str) -> bool:
    """Whether the simulator's answer says the command was not understood or not possible.

    Only the first line is read: failures are one sentence, while a valid `look at` may
    mention e.g. "already" further down."""
    first_line = observation.strip().split("\n", 1)[0]
    return _FAILURE.search(first_line) is not None


class SciWorldEnv(TextEnv):
    """ScienceWorld text environment (see the module docstring).

    Experts read `task` and `variation`, `actions` (the commands sent this episode, answers
    to questions included) and `gold_actions()`.
    """

    env_id = "sciworld"
    instruction = INSTRUCTION

    def __init__(self, reward: str = "score", simplification: str = "") -> None:
        """Args:
            reward: "score", "success" or "raw" (see the module docstring).
            simplification: ScienceWorld simplifications, comma-separated (e.g.
                "openDoors,teleportAction" or "easy"); "" = none, as in the original.
        """
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)}; got {reward!r}")
        unknown = [name for name in simplification.split(",") if name and name not in SIMPLIFICATIONS]
        if unknown:
            raise ValueError(f"unknown simplification {unknown[0]!r}; choose from {', '.join(SIMPLIFICATIONS)}")
        self.reward_mode = reward
        self.simplification = simplification
        self._sim: Simulator | None = None
        self.task: SciTask | None = None
        self.variation = -1
        self._sent: list[str] = []  # every command sent since the load: what a replay needs
        self._last_raw = ""  # the simulator's answer to the last command sent
        self._actions: list[str] = []
        self._gold: list[str] | None = None
        self._awaiting_choice = False
        self._listed: tuple[tuple[int, int], list[str]] | None = None  # (state, its available actions)
        self._score = 0  # the simulator's score now
        self._paid = 0  # the score the rewards so far add up to
        self._done = True
        self._info: dict[str, Any] = {}
        self.episode = 0
        self.restarts = 0  # JVMs started to replace a dead one

    # -- state read by experts and tests ----------------------------------------------
    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self._actions)

    @property
    def jvm_pid(self) -> int | None:
        """The JVM's process id, or None when none is running."""
        return self._sim.pid if self._sim is not None else None

    def gold_actions(self) -> list[str]:
        """The simulator's gold action sequence for the current item, from its start.

        Generating it makes a load slower (0.2-3 s), so it is made on first request: the
        variation is loaded again with the gold path and the episode's commands replayed.
        """
        if self.task is None:
            raise EnvStateError("call reset before asking for the gold path")
        if self._gold is None:
            # Not verified: were the replay to differ (it has not), the expert would only be
            # a little off, while raising would end the episode.
            self._gold = self._call(lambda server: self._restore(server, gold=True, verify=False))
        return list(self._gold)

    # -- TextEnv API -------------------------------------------------------------------
    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if item_id is None:
            train = sciworld_tasks("train")
            index = train[random.Random(seed).randrange(len(train))].index
        else:
            index = parse_item_index(item_id, self.env_id)
        self.task, self.variation = item_task(index)  # raises ValueError past NUM_ITEMS
        self._sent, self._actions, self._gold = [], [], None
        self._last_raw, self._awaiting_choice, self._score, self._paid = "", False, 0, 0
        self._done = True  # until the first observation is in
        self.episode += 1
        self._call(lambda server: self._restore(server, gold=False, verify=False))
        # A sub-goal met from the start (e.g. "be in the workshop") may already count after
        # this first look: the agent did nothing for it, so it is never paid.
        look, self._score, _ = self._exchange("look around")
        self._paid = self._score
        description = self._call(lambda server: str(server.getTaskDescription()))
        self._done = False
        self._info = {
            "item_id": f"{self.env_id}_{index}",
            "task_id": self.task.task_id,
            "task_name": self.task.name,
            "variation": self.variation,
            "category": self.task.category,
        }
        return f"{description}\n{look}", {**self._info, "score": self._score, "success": False,
                                           "task_description": description}

    def step(self, action: str) -> StepResult:
        if self.task is None or self._sim is None:
            raise EnvStateError("call reset before step")
        if self._done:
            raise EnvStateError("the episode has ended; call reset")
        command = extract_action(action or "")
        if command is None:
            obs = "Your reply held no action. Reply with one action, e.g. `look around`."
            return obs, 0.0, False, False, self._step_info(self._score, invalid=True)
        if self._awaiting_choice and not command.isdigit():
            self._exchange("")  # a blank answer cancels the simulator's question
        self._actions.append(command)
        try:
            obs, score, completed = self._exchange(command)
        except Py4JJavaError as error:  # the simulator threw on this command; it is still up
            obs = f"The simulator could not carry out that action ({error.java_exception})."
            return obs, 0.0, False, False, self._step_info(self._score, invalid=True)
        self._awaiting_choice = obs.startswith(_AMBIGUOUS)
        previous, self._paid, self._score = self._paid, score, score
        success = score >= 100
        terminated = bool(completed) or score < 0 or success
        self._done = terminated
        invalid = is_failure_message(obs)
        reward = 0.0 if invalid else self._reward(previous, score)  # a rejected action earns nothing
        return obs, reward, terminated, False, self._step_info(score, invalid=invalid, success=success)

    def snapshot(self) -> bytes:
        """A replay, not the simulator's memory (ScienceWorld cannot save its state): the task,
        the commands sent so far and the episode's bookkeeping. `restore` loads the task and
        sends the commands again, which costs a step per command taken (~1 ms each) and reaches
        the same state because the simulator is deterministic (checked: the last answer must
        come back the same)."""
        if self.task is None:
            raise EnvStateError("call reset before snapshot")
        return snapshots.dump(self.env_id, {
            "task": self.task, "variation": self.variation, "sent": list(self._sent), "actions": list(self._actions),
            "last_raw": self._last_raw, "awaiting_choice": self._awaiting_choice, "score": self._score,
            "paid": self._paid, "done": self._done, "info": dict(self._info)})

    def restore(self, state: bytes) -> None:
        saved = snapshots.load(self.env_id, state)
        self.task, self.variation = saved["task"], saved["variation"]
        self._sent, self._actions, self._gold = list(saved["sent"]), list(saved["actions"]), None
        self._last_raw, self._awaiting_choice = saved["last_raw"], saved["awaiting_choice"]
        self._score, self._paid, self._done = saved["score"], saved["paid"], saved["done"]
        self._info = dict(saved["info"])
        self.episode += 1
        self._call(lambda server: self._restore(server, gold=False, verify=True))

    def expert_action(self) -> str | None:
        """The next action of the task's gold path not yet taken (`expert.SciWorldExpert`)."""
        if self.task is None:
            return None
        from .expert import SciWorldExpert

        return SciWorldExpert().act(self)

    def available_actions(self) -> list[str] | None:
        """The commands well-formed now on the things in reach (the simulator's
        `getValidActionObjectCombinations`: a few hundred to a few thousand, too many for a
        prompt, which lists `ACTION_TEMPLATES` instead), without "reset task", which would
        start the task over. The simulator still refuses some ("connect bee 4 to air"). While
        it asks which object a command meant, it lists nothing, and the numbers it offers are
        the list. Computed once per state (0.05-0.2 s)."""
        if self.task is None:
            return None
        state = (self.episode, len(self._sent))
        if self._listed is None or self._listed[0] != state:
            listed = self._call(lambda server: [str(action) for action in server.getValidActionObjectCombinations()])
            choices = _CHOICE.findall(self._last_raw) if self._awaiting_choice else []
            self._listed = state, list(dict.fromkeys([*choices, *(a for a in listed if a != "reset task")]))
        return list(self._listed[1])

    def close(self) -> None:
        sim, self._sim = self._sim, None
        self._done = True
        if sim is not None:
            sim.close()

    # -- helpers -------------------------------------------------------------------------
    def _reward(self, previous: int, score: int) -> float:
        if self.reward_mode == "raw":
            return float(score - previous)
        if self.reward_mode == "success":
            return float(score >= 100 > previous)
        return (max(score, 0) - max(previous, 0)) / 100

    def _step_info(self, score: int, invalid: bool, success: bool = False) -> dict[str, Any]:
        return {**self._info, "score": score, "success": success, "invalid_action": invalid,
                "ambiguous": self._awaiting_choice, "jvm_restarts": self.restarts}

    def _exchange(self, command: str) -> tuple[str, int, bool]:
        """Send one command: (observation, score -100..100, completed)."""

        def send(server: Any) -> tuple[str, int, bool]:
            obs = str(server.step(command))
            return obs, round(100 * server.getScore()), bool(server.getCompleted())

        result = self._call(send)
        self._sent.append(command)
        self._last_raw = result[0]
        return result

    def _restore(self, server: Any, gold: bool, verify: bool) -> list[str] | None:
        """Load the current variation (with its gold path when `gold`, which is returned)
        and replay the commands sent so far. With `verify`, raise SimulatorDied when the
        replay does not end with the answer the agent saw last."""
        server.load(self.task.name, self.variation, self.simplification, gold)
        last = ""
        for command in self._sent:
            last = str(server.step(command))
        if verify and last != self._last_raw:
            raise SimulatorDied(f"replaying {len(self._sent)} commands did not reach the same state")
        if not gold:
            return None
        actions = server.getGoldActionSequence()
        try:
            return [str(action) for action in actions]
        finally:
            self._sim.release(actions)

    def _call(self, fn: Callable[[Any], T]) -> T:
        """`fn(server)` on this env's JVM: started when none runs, replaced (with the
        episode restored on the new one) when the call finds it dead."""
        if self._sim is None:
            self._sim = Simulator()
        try:
            return fn(self._sim.server)
        except Py4JError as error:
            if not is_connection_error(error):
                raise
        self._replace_simulator()
        try:
            return fn(self._sim.server)
        except Py4JError as error:
            if not is_connection_error(error):
                raise
            self._done = True
            raise SimulatorDied(f"the ScienceWorld JVM died twice on one call ({error})") from error

    def _replace_simulator(self) -> None:
        """Start a new JVM and bring it to where the dead one was."""
        old, self._sim = self._sim, None
        if old is not None:
            old.close()
        self.restarts += 1
        self._sim = Simulator()
        try:
            self._restore(self._sim.server, gold=self._gold is not None, verify=True)
        except (Py4JError, SimulatorDied) as error:
            self._done = True
            raise SimulatorDied(f"the ScienceWorld JVM died and {self._info.get('item_id', 'the episode')} "
                                f"could not be restored on a new one: {error}") from error
