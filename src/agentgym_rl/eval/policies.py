"""Policies that act without a model: the environment's expert and a random baseline."""

from __future__ import annotations

import random

from ..envs.base import TextEnv


class RandomPolicy:
    """Picks uniformly among the environment's available actions (seeded)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def act(self, env: TextEnv) -> str:
        actions = env.available_actions()
        if not actions:
            raise ValueError(f"environment {env.env_id!r} cannot list its actions; no random policy")
        return f"Action: {self.rng.choice(actions)}"
