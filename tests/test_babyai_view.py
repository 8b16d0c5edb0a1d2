"""What the BabyAI agent sees, computed without minigrid's view grid, equals minigrid's.

`render.view_mask` replaces `gen_obs_grid()` for the observation text and the expert's bot
(it was most of the expert's time); these tests compare the two on every pose of several
levels, with doors open, closed and locked.
"""

from __future__ import annotations

import random

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* ids with gymnasium)
import numpy as np
import pytest
from minigrid.core.world_object import Door
from minigrid.utils.baby_ai_bot import BabyAIBot

from agentgym_rl.envs.babyai.expert import _ResumingBot
from agentgym_rl.envs.babyai.render import view_mask

# One room, several rooms with doors, locked doors, a maze of rooms.
LEVEL_IDS = ("BabyAI-GoToRedBallGrey-v0", "BabyAI-OpenDoor-v0", "BabyAI-UnlockLocal-v0", "BabyAI-GoToObjMaze-v0")


def _level(gym_id: str, seed: int):
    level = gym.make(gym_id, disable_env_checker=True).unwrapped
    level.reset(seed=seed)
    return level


def _poses(level, rng: random.Random, count: int):
    """`count` random (cell, direction) where the agent may stand, doors set at random each time."""
    free = [(x, y) for x in range(level.width) for y in range(level.height)
            if level.grid.get(x, y) is None or level.grid.get(x, y).type == "door"]
    doors = [cell for cell in level.grid.grid if isinstance(cell, Door)]
    for _ in range(count):
        for door in doors:
            door.is_open = rng.random() < 0.5
            door.is_locked = not door.is_open and rng.random() < 0.3
        yield rng.choice(free), rng.randrange(4)


@pytest.mark.parametrize("gym_id", LEVEL_IDS)
def test_the_view_mask_is_minigrids_on_random_poses(gym_id):
    rng = random.Random(0)
    level = _level(gym_id, seed=1)
    assert any(isinstance(cell, Door) for cell in level.grid.grid) or gym_id.endswith("Grey-v0")
    checked = 0
    for (x, y), direction in _poses(level, rng, 300):
        level.agent_pos, level.agent_dir = (x, y), direction
        _, expected = level.gen_obs_grid()
        assert np.array_equal(view_mask(level), expected), (gym_id, (x, y), direction)
        checked += int(expected.sum() < expected.size)  # a pose where something is hidden
    assert checked > 100  # occlusion happened: the sweep was tested, not only the all-visible case


def test_beyond_the_level_is_a_wall_as_in_minigrid():
    """Without its outer wall, the view reaches past the level's edge, which hides like a wall."""
    level = _level("BabyAI-OpenDoor-v0", seed=0)
    for x in range(level.width):
        level.grid.set(x, 0, None)
        level.grid.set(x, level.height - 1, None)
    for y in range(level.height):
        level.grid.set(0, y, None)
        level.grid.set(level.width - 1, y, None)
    for x, y in ((0, 1), (1, 0), (level.width - 1, 3), (2, level.height - 1)):
        for direction in range(4):
            level.agent_pos, level.agent_dir = (x, y), direction
            assert np.array_equal(view_mask(level), level.gen_obs_grid()[1]), ((x, y), direction)


def test_the_view_mask_sees_everything_through_walls_when_the_level_does():
    level = _level("BabyAI-OpenDoor-v0", seed=0)
    level.see_through_walls = True
    assert view_mask(level).all() and level.gen_obs_grid()[1].all()


def test_the_expert_bot_marks_the_same_cells_seen_as_minigrids_bot():
    rng = random.Random(1)
    level = _level("BabyAI-GoToObjMaze-v0", seed=2)
    bot = _ResumingBot(level, np.zeros((level.width, level.height), dtype=bool))
    for (x, y), direction in _poses(level, rng, 200):
        level.agent_pos, level.agent_dir = (x, y), direction
        bot.vis_mask[:] = False
        BabyAIBot._process_obs(bot)
        expected = bot.vis_mask.copy()
        bot.vis_mask[:] = False
        bot._process_obs()
        assert np.array_equal(bot.vis_mask, expected), ((x, y), direction)
