"""`BabyAIEnv`: minigrid's BabyAI levels as a text game.

Item `i` is level `LEVELS[i % 40]` generated with minigrid seed `i // 40` (see `levels`).
Each turn the agent sends one text action (see `actions`); high-level actions run several
minigrid primitive steps. Reward is minigrid's own (`1 - 0.9 * steps / max_steps` on
success, counting primitive steps). The episode terminates when minigrid does (mission done,
or failed in strict levels) and is truncated when minigrid's `max_steps` run out.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
import threading
from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* ids with gymnasium)
import numpy as np

from .. import snapshots
from ..base import EnvStateError, StepResult, TextEnv, parse_item_index
from ..parsing import extract_action
from .actions import execute, parse_action
from .expert import pose, state_key
from .levels import NUM_TEST, NUM_ITEMS, item_level
from .render import available_actions, describe, mark_seen, observe

INSTRUCTION = (
    "You are an agent in a grid world made of rooms. Each turn you are told your goal, "
    "the objects you can see relative to you, what you carry and the available actions. "
    'Objects are named by color, type and number, e.g. "red ball 1"; the numbers refer to '
    "the current observation. Reply in exactly this format:\n"
    "Thought: <a short reason>\n"
    "Action: <one action from the available actions>"
)


_STDOUT_LOCK = threading.Lock()


def make_level(gym_id: str, seed: int):
    """Build and reset the unwrapped minigrid env of a level; its "Sampling rejected" prints
    are swallowed."""
    env = gym.make(gym_id, disable_env_checker=True).unwrapped
    # sys.stdout is process-wide: without the lock, two threads resetting at once can
    # restore each other's replacement and silence stdout for good.
    with _STDOUT_LOCK, contextlib.redirect_stdout(io.StringIO()):
        env.reset(seed=seed)
    return env


UNCHANGED_NOTE = "That action changed nothing."
"""What `note_unchanged` puts before the observation after an accepted action that left the level
as it was."""


class BabyAIEnv(TextEnv):
    """BabyAI text environment (see the module docstring).

    Experts read `minigrid_env` (the live unwrapped minigrid env; copy it before stepping),
    `primitive_history` (minigrid actions taken since reset), `episode` (a reset counter) and
    `seen_mask` (cells seen so far, which path planning may cross).
    """

    env_id = "babyai"
    instruction = INSTRUCTION

    def __init__(self, list_actions: bool = True, note_unchanged: bool = False) -> None:
        """Args:
            list_actions: end each observation with the available actions, as the original
                environment does. Off, observations are ~40% shorter (the quickstart's tiny
                model learns the action names from the objects in view); "check available
                actions" still lists them.
            note_unchanged: begin the observation after an accepted action that left the level
                as it was (e.g. a "go to" what the agent already faces) with "That action
                changed nothing." The original says nothing: the observation repeats word for
                word. (SmolLM2-135M-Instruct repeats its reply after the note as before it:
                docs/RESULTS.md.)
        """
        self.list_actions = list_actions
        self.note_unchanged = note_unchanged
        self._mg = None
        self._seen: np.ndarray | None = None
        self._history: list[int] = []
        self._info: dict[str, Any] = {}
        self._done = True
        self.episode = 0

    # -- state read by experts -------------------------------------------------------
    @property
    def minigrid_env(self):
        return self._mg

    @property
    def primitive_history(self) -> tuple[int, ...]:
        return tuple(self._history)

    @property
    def seen_mask(self) -> np.ndarray:
        return self._seen.copy()

    # -- TextEnv API -------------------------------------------------------------------
    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if item_id is None:
            index = random.Random(seed).randrange(NUM_TEST, NUM_ITEMS)
        else:
            index = parse_item_index(item_id, self.env_id)
        level, level_seed = item_level(index)
        self.close()
        self._mg = make_level(level.gym_id, level_seed)
        self._seen = np.zeros((self._mg.width, self._mg.height), dtype=bool)
        mark_seen(self._mg, self._seen)
        self._history = []
        self._done = False
        self.episode += 1
        self._info = {
            "item_id": f"{self.env_id}_{index}",
            "level": level.name,
            "category": level.category,
            "mission": self._mg.mission,
        }
        return describe(observe(self._mg), self.list_actions), {**self._info, "state_key": self.state_key()}

    def step(self, action: str) -> StepResult:
        if self._mg is None:
            raise EnvStateError("call reset before step")
        if self._done:
            raise EnvStateError("the episode has ended; call reset")
        command = parse_action(extract_action(action or ""))
        state_before = self.state_key() if self.note_unchanged else None
        seen_before = int(self._seen.sum())
        outcome = execute(command, self._mg, self._seen)
        self._history.extend(outcome.primitives)
        self._done = outcome.done
        success = outcome.terminated and outcome.reward > 0
        asked = command is not None and command.verb == "check available actions"
        obs = describe(observe(self._mg), self.list_actions or asked)
        state_after = self.state_key()
        if outcome.error is not None:
            obs = f"You cannot do that: {outcome.error}. {obs}"
        elif success:
            obs = f"You completed the mission. {obs}"
        elif outcome.terminated:
            obs = f"You failed the mission. {obs}"
        elif outcome.truncated:
            obs = f"You ran out of steps. {obs}"
        elif state_before == state_after and not asked:
            obs = f"{UNCHANGED_NOTE} {obs}"
        info = {
            **self._info,
            "success": success,
            "invalid_action": outcome.error is not None,
            "action_kind": command.verb if command is not None else "",
            "primitive_steps": len(outcome.primitives),
            "discovered": int(self._seen.sum()) - seen_before,  # cells seen for the first time
            "state_key": state_after,
        }
        return obs, float(outcome.reward), outcome.terminated, outcome.truncated, info

    def snapshot(self) -> bytes:
        """The level as it is (minigrid's env, its random state and the mission's progress), the
        cells seen, the primitive actions taken and the episode's info."""
        if self._mg is None:
            raise EnvStateError("call reset before snapshot")
        return snapshots.dump(self.env_id, (self._mg, self._seen, list(self._history), self._done, dict(self._info)))

    def restore(self, state: bytes) -> None:
        mg, seen, history, done, info = snapshots.load(self.env_id, state)
        # Unpickled afresh, so two instances restored from one snapshot share nothing.
        self._mg, self._seen, self._history, self._done, self._info = mg, seen, list(history), done, dict(info)
        self.episode += 1  # the expert's bot, kept between turns of an episode, starts again from here

    def state_key(self) -> str:
        """A digest of the true state: the objects, doors, what is carried, the mission's progress
        and the agent's pose (`expert.state_key`, `expert.pose`); equal digests in one level mean
        the same state, whatever the partial view showed (GiGPO's step groups)."""
        whole = repr((state_key(self._mg), pose(self._mg)))
        return hashlib.blake2b(whole.encode(), digest_size=8).hexdigest()

    def available_actions(self) -> list[str] | None:
        if self._mg is None:
            return None
        return available_actions(observe(self._mg))

    def expert_action(self) -> str | None:
        """minigrid's `BabyAIBot`, kept between turns of the episode (`expert.EpisodeExpert`)."""
        if self._mg is None:
            return None
        from .expert import EpisodeExpert

        if getattr(self, "_expert", None) is None:
            self._expert = EpisodeExpert()
        return self._expert.act(self)

    def close(self) -> None:
        if self._mg is not None:
            self._mg.close()
        self._mg = None
        self._done = True
