"""A policy that acts without a model: a random baseline over the environment's listed actions."""

from __future__ import annotations

import random

from ..envs.base import TextEnv
from ..rollout.policy import TextPolicy


class RandomPolicy(TextPolicy):
    """Picks uniformly among the environment's available actions (seeded)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def reply(self, env: TextEnv) -> str:
        actions = env.available_actions()
        if not actions:
            raise ValueError(f"environment {env.env_id!r} cannot list its actions; no random policy")
        return f"Action: {self.rng.choice(actions)}"
