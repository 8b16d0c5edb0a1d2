"""The 40 BabyAI levels and the item mapping.

Item index `i` plays level `LEVELS[i % 40]` generated with minigrid seed `i // 40`, so items
0..39 are the first seed of every level, 40..79 the second, and so on.

Splits: "test" is items 0..89 (90 items, the size of the original AgentGym test set: every
level twice plus the first ten levels a third time); "train" is items 90..9999.

Categories (the reporting groups of the original benchmark):

- GoTo: go to an object or door (`GoTo*`).
- Pickup: pick an object up (`Pickup*`).
- AOD: act on an object or door: open, unlock, put next to (`Open*`, `Unlock*`, `PutNext*`,
  `ActionObjDoor`).
- Find: search for an object that is out of sight (`FindObj*`, `KeyCorridor*`).
- Room: move through one large room or a maze of rooms (`OneRoom*`, `MoveTwoAcross*`,
  `GoToObjMaze*`).
- SLoc: composed instructions with location words (`SynthLoc`, `SynthS5R2`).

Levels were kept when the expert (`expert.EpisodeExpert`) solved at least 9 of their first
12 seeds within the 20-turn evaluation limit (34 of the 40 solve all 12). Left out: GoTo,
GoToSeq, GoToImpUnlock, Pickup, UnblockPickup, Unlock, KeyCorridorS3R3, Synth, SynthSeq,
MiniBossLevel and BossLevel(NoUnlock), whose large mazes or many subtasks often need more
than 20 turns of exploration; BlockedUnlockPickup and KeyCorridorS3R2, solved but with 18-20
turns; KeyInBox, which the bot cannot solve.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tasks import Task

CATEGORIES = ("GoTo", "Pickup", "AOD", "Find", "Room", "SLoc")
NUM_TEST = 90
NUM_ITEMS = 10_000


@dataclass(frozen=True)
class Level:
    """A BabyAI level: `name` as in the gymnasium id `BabyAI-<name>-v0`, and its category."""

    name: str
    category: str

    @property
    def gym_id(self) -> str:
        return f"BabyAI-{self.name}-v0"


LEVELS: tuple[Level, ...] = (
    # Items 0..9 and 40..49 and 80..89 are in the test split: one easy level per category
    # first, so that every category has three test items.
    Level("GoToRedBallGrey", "GoTo"),  # single room, grey distractors
    Level("GoToRedBall", "GoTo"),
    Level("GoToObj", "GoTo"),  # single object
    Level("PickupLoc", "Pickup"),  # location words ("on your left")
    Level("OpenDoor", "AOD"),
    Level("PutNextLocal", "AOD"),
    Level("FindObjS5", "Find"),  # the object is in one of several rooms
    Level("OneRoomS8", "Room"),
    Level("SynthS5R2", "SLoc"),  # composed instruction, 2x2 rooms of size 5
    Level("UnlockLocal", "AOD"),  # fetch the key, open the locked door
    Level("GoToRedBallNoDists", "GoTo"),
    Level("GoToLocal", "GoTo"),
    Level("GoToRedBlueBall", "GoTo"),
    Level("GoToDoor", "GoTo"),
    Level("GoToObjDoor", "GoTo"),
    Level("GoToOpen", "GoTo"),  # 3x3 rooms, all doors open
    Level("GoToSeqS5R2", "GoTo"),  # sequences of go-to
    Level("PickupDist", "Pickup"),
    Level("PickupAbove", "Pickup"),  # the object is in the room above
    Level("Open", "AOD"),  # 3x3 rooms
    Level("OpenRedDoor", "AOD"),
    Level("OpenDoorLoc", "AOD"),
    Level("OpenTwoDoors", "AOD"),
    Level("OpenDoorsOrderN2", "AOD"),
    Level("OpenDoorsOrderN4", "AOD"),
    Level("PutNextS5N2", "AOD"),  # put next to, across two rooms
    Level("PutNextS6N3", "AOD"),
    Level("UnlockPickup", "AOD"),
    Level("ActionObjDoor", "AOD"),
    Level("UnlockToUnlock", "AOD"),  # a key behind a locked door opens the next door
    Level("FindObjS6", "Find"),
    Level("KeyCorridorS3R1", "Find"),  # the key is in a side room off a corridor
    Level("FindObjS7", "Find"),
    Level("OneRoomS12", "Room"),  # one large room
    Level("OneRoomS16", "Room"),
    Level("MoveTwoAcrossS5N2", "Room"),  # two put-next tasks across two rooms
    Level("GoToObjMazeS4", "Room"),  # maze of small rooms
    Level("GoToObjMazeS6", "Room"),
    Level("SynthLoc", "SLoc"),  # composed instruction with location words, 3x3 rooms
    Level("PutNextS7N4", "AOD"),
)
assert len(LEVELS) == 40 and all(level.category in CATEGORIES for level in LEVELS)


def item_level(index: int) -> tuple[Level, int]:
    """The level and minigrid seed of item `index`."""
    if not 0 <= index < NUM_ITEMS:
        raise ValueError(f"babyai item index must be in [0, {NUM_ITEMS}), got {index}")
    return LEVELS[index % len(LEVELS)], index // len(LEVELS)


def babyai_tasks(split: str) -> list[Task]:
    """The tasks of a split: "test" = items 0..89, "train" = items 90..9999."""
    if split == "test":
        indices = range(NUM_TEST)
    elif split == "train":
        indices = range(NUM_TEST, NUM_ITEMS)
    else:
        raise ValueError(f"unknown split {split!r}; choose 'train' or 'test'")
    return [Task("babyai", i, item_level(i)[0].category) for i in indices]
