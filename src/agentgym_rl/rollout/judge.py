"""An LLM judge as a reward (`env.judge`): a chat model given a rubric and an episode's
transcript scores it from 0 to 1, and that score is the episode's reward (or is added to it,
`env.reward_mode`), through the same path as a reward written in Python (`rewards.py`).

The judge is any OpenAI-compatible `/chat/completions` endpoint (`agentgym-rl serve-model`
serves a local one), asked at temperature 0 for its reasoning and a last line `Score: X`. Its
URL comes from a config or the command line, never from a request. Answers are cached by
(model, rubric, transcript): in memory, and with `env.judge.cache` in a JSON-lines file, so an
evaluation run again or a resumed run asks only about episodes it has not judged. A judge that
fails (no answer after the retries, or no score in its reply) fails the episode it was judging,
recorded with the reason, as any reward function's failure is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from ..agent.openai_generator import OpenAIClient
from .trajectory import Trajectory

SCORE = re.compile(r"score\s*[:=]\s*([0-9]*\.?[0-9]+)", re.IGNORECASE)

INSTRUCTION = ("You grade one episode of an agent acting in a text environment. {rubric}\n"
               "Give your reasons briefly, then end with one line: Score: X, where X is a number from 0 to 1.")


def transcript(trajectory: Trajectory) -> str:
    """The episode as the judge reads it: each message under its role, then what the environment
    reported."""
    lines = [f"{message['role'].upper()}: {message['content']}" for message in trajectory.messages]
    lines.append(f"(The environment reported success={trajectory.success}, reward={trajectory.reward:g}, "
                 f"after {trajectory.turns} turns.)")
    return "\n\n".join(lines)


def parse_score(reply: str) -> float:
    """The last `Score: X` of a judge's reply, X in [0, 1].

    Raises:
        ValueError: no score, or one outside [0, 1].
    """
    found = SCORE.findall(reply)
    if not found:
        raise ValueError(f"the judge gave no 'Score: X' line ({reply[-120:]!r})")
    score = float(found[-1])
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"the judge's score {score:g} is not between 0 and 1")
    return score


class LLMJudge:
    """A reward function (trajectory, info) -> score from a chat model.

    Args:
        url: the API root, e.g. "http://127.0.0.1:8000/v1"; the bearer token is $OPENAI_API_KEY.
        model: the model name the endpoint serves.
        rubric: what a good episode is, in the judge's instruction.
        cache: a JSON-lines file of earlier answers, read at start and appended to (None: memory only).
        timeout, retries: of each request (`OpenAIClient`).
    Attributes:
        asked: requests sent (answers taken from the cache are not).
    """

    def __init__(self, url: str, model: str, rubric: str, cache: str | Path | None = None, timeout: float = 120.0,
                 retries: int = 2):
        self.model, self.rubric = model, rubric
        self.client = OpenAIClient(url, timeout=timeout, retries=retries, api_key=os.environ.get("OPENAI_API_KEY"))
        self.cache_path = Path(cache) if cache else None
        self._lock = threading.Lock()
        self._scores: dict[str, float] = {}
        self.asked = 0
        if self.cache_path is not None and self.cache_path.is_file():
            for line in self.cache_path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    self._scores[entry["key"]] = float(entry["score"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line a killed write cut short: asked again

    def key(self, text: str) -> str:
        return hashlib.sha256(json.dumps([self.model, self.rubric, text]).encode()).hexdigest()

    def __call__(self, trajectory: Trajectory, info: dict[str, Any]) -> float:
        text = transcript(trajectory)
        key = self.key(text)
        with self._lock:
            if key in self._scores:
                return self._scores[key]
        answer = self.client.post("/chat/completions", {
            "model": self.model, "temperature": 0.0, "max_tokens": 512,
            "messages": [{"role": "system", "content": INSTRUCTION.format(rubric=self.rubric)},
                         {"role": "user", "content": text}]})
        try:
            reply = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("the judge's answer holds no choices[0].message.content") from None
        score = parse_score(str(reply))
        with self._lock:
            self.asked += 1
            self._scores[key] = score
            if self.cache_path is not None:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self.cache_path.open("a") as cache:
                    cache.write(json.dumps({"key": key, "score": score}) + "\n")
        return score
