"""The `Trajectory` record: one episode, as text and as the exact token ids trained on."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

from ..errors import UserError
from ..jsonlines import read_json_lines


@dataclass
class Trajectory:
    """One episode of one task.

    Token fields are empty for scripted policies (expert, random), which act in text.
    All token lists have the same length T.

    Attributes:
        env_id, item_id, category: which task.
        group: index of the task within its batch; samples of one task share it (GRPO groups).
        messages: the conversation as the environment saw it ({"role", "content"} dicts):
            system (optional), then user observation / assistant reply turns, ending with
            the final observation.
        input_ids: (T,) the conversation as token ids, exactly as sampled: one growing
            sequence, unless `rollout.keep_turns` cut the context, then each context window's
            ids back to back (`window_starts`).
        loss_mask: (T,) 1 on tokens the model generated, 0 on prompt/environment tokens.
        logprobs: (T,) behaviour log-probabilities of generated tokens, 0 elsewhere.
        turn_rewards: one reward per environment step.
        success: the environment reported the task solved.
        terminated, truncated: how the episode ended (truncated = turn, step or context limit).
        invalid_actions: how many actions the environment could not use.
        invalid_turns: which turns (0-based) those were.
        wrong_tokens: for rejected replies, the index in `input_ids` of the token where the
            action first left every available action (recorded with
            `RolloutConfig.locate_wrong_tokens`).
        right_tokens: for each of `wrong_tokens`, the token ids that would have continued a
            listed action there (`envs.parsing.right_next_tokens`; may be empty).
        state_keys: one per turn, the environment's name for the state its action was taken from
            (`info["state_key"]` of the reset or the step before), "" when it gives none.
        idle_turns: turns (0-based) whose action the environment accepted but that left it in a
            state the episode had already been in (by `info["state_key"]`: BabyAI's "go to X"
            with X reached already, or a move undoing the one before).
        idle_tokens: for idle turns, the index in `input_ids` of the token that begins the
            action (`envs.parsing.action_token`; recorded with `RolloutConfig.locate_wrong_tokens`).
        action_tokens: for the other accepted turns (those that reached a state new to the
            episode, or any accepted turn where the environment names no states), the index in
            `input_ids` of the token that begins the action (recorded with
            `RolloutConfig.locate_wrong_tokens`).
        action_verbs: for each of `action_tokens`, the word its action begins with
            (`envs.parsing.action_verb`: "go", "pickup", "craft").
        discovery_tokens: those of `action_tokens` whose action showed the agent something for
            the first time in the episode (`info["discovered"]` > 0: BabyAI's unseen cells).
        error: why the episode failed to run (an exception in the env), else None.
        policy_version: in an RL run, how many updates the weights that sampled it had had
            (the step, unless `train.asynchronous` played it ahead with older ones).
    """

    env_id: str
    item_id: str
    category: str
    group: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    invalid_actions: int = 0
    invalid_turns: list[int] = field(default_factory=list)
    wrong_tokens: list[int] = field(default_factory=list)
    right_tokens: list[list[int]] = field(default_factory=list)
    state_keys: list[str] = field(default_factory=list)
    idle_turns: list[int] = field(default_factory=list)
    idle_tokens: list[int] = field(default_factory=list)
    action_tokens: list[int] = field(default_factory=list)
    action_verbs: list[str] = field(default_factory=list)
    discovery_tokens: list[int] = field(default_factory=list)
    error: str | None = None
    policy_version: int | None = None
    turn_versions: list[int] = field(default_factory=list)
    """The policy version that wrote each turn's reply, when weights may change within an
    episode (`train.partial_rollouts`); empty otherwise."""
    window_starts: list[int] = field(default_factory=list)
    """Where in `input_ids` each context window after the first begins (`rollout.keep_turns`);
    empty: the episode is one window. A window is what the model was shown, from its opening
    (system prompt, the first observation) on: a reply is trained (loss mask 1) in the window
    it was written in, and appears as context (0) in the later windows that keep it."""
    summaries: list[dict[str, Any]] = field(default_factory=list)
    """`rollout.summarize`: each summary the policy wrote, {"turns": the turns played when it was
    asked, "text": it}; a model's summary ids are in `input_ids` at the end of the window it was
    written in, trained (loss mask 1) like a reply."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, giving a field the record lacks its default: a journal written before the
        field was added (`rollout.journal_every`) is continued by the newer code."""
        defaults = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
                    for f in fields(self)
                    if f.name not in state and (f.default is not MISSING or f.default_factory is not MISSING)}
        self.__dict__.update({**defaults, **state})

    @property
    def reward(self) -> float:
        """The outcome reward: the sum of turn rewards."""
        return float(sum(self.turn_rewards))

    @property
    def turns(self) -> int:
        return len(self.turn_rewards)

    def replies(self) -> list[tuple[int, int]]:
        """(start, end) in `input_ids` of each reply the model generated (a summary too,
        `rollout.summarize`): the runs of 1s in the loss mask, in order."""
        spans, start = [], None
        for index, trained in enumerate([*self.loss_mask, 0]):
            if trained and start is None:
                start = index
            elif not trained and start is not None:
                spans.append((start, index))
                start = None
        return spans

    def windows(self) -> list[tuple[int, int]]:
        """(start, end) in `input_ids` of each context window, in order (one for an episode
        whose context was never cut; none without token ids)."""
        bounds = [0, *self.window_starts, len(self.input_ids)]
        return [(start, end) for start, end in zip(bounds, bounds[1:]) if end > start]

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["reward"] = self.reward
        record["turns"] = self.turns
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "Trajectory":
        known = {k: v for k, v in record.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def save_trajectories(trajectories: Iterable[Trajectory], path: str | Path) -> None:
    """Write one JSON object per line."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for trajectory in trajectories:
            f.write(json.dumps(trajectory.to_json()) + "\n")


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a JSONL file written by `save_trajectories`; errors name the file and line, and a
    last line cut off mid-write is skipped with a warning (`read_json_lines`)."""
    source = Path(path)
    if not source.is_file():
        raise UserError(f"trajectory file {str(path)!r} does not exist")
    trajectories = []
    for number, record in enumerate(read_json_lines(source), start=1):
        try:
            trajectories.append(Trajectory.from_json(record))
        except (TypeError, AttributeError) as error:  # valid JSON, but not an object with our fields
            raise UserError(f"{path}: record {number}: not a trajectory record ({error})") from None
    return trajectories
