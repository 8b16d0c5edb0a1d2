"""Color-permuted copies of BabyAI episodes, to train on more than the expert played.

minigrid's dynamics treat the six colors alike, so an episode whose color words are renamed by
one permutation throughout (mission, observations, actions) is an episode of the level with its
colors renamed, played as the expert would play it. A small model trained on such copies cannot
get by on which color a level's goal usually names (GoToRedBall's is always red); it has to take
the color from the goal. (One difference from what the renamed level would show: objects at
equal distance are listed by color name, so a renamed list may have two of them swapped.)
"""

from __future__ import annotations

import random
import re
from typing import Any

from minigrid.core.constants import COLOR_NAMES

_COLOR_WORD = re.compile(r"\b(" + "|".join(COLOR_NAMES) + r")\b")


def permute_colors(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """`messages` with every color word renamed by one random permutation of the colors."""
    shuffled = list(COLOR_NAMES)
    rng.shuffle(shuffled)
    renamed = dict(zip(COLOR_NAMES, shuffled))
    return [dict(message, content=_COLOR_WORD.sub(lambda match: renamed[match.group(1)], message["content"]))
            for message in messages]
