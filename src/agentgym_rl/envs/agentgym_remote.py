"""`AgentGymEnv`: an environment on one of AgentGym's own env servers (`agentenv-babyai`,
`agentenv-textcraft`, `agentenv-sciworld`), or on ours through the AgentGym endpoints it
also answers, as a `TextEnv`. Give its URL as `agentgym+http://host:port` in `env.urls`.

AgentGym's protocol carries less than ours, and the differences are kept visible:

- Items are sent as `data_idx`: SciWorld's mean the same (task, variation) on both servers;
  BabyAI's and TextCraft's index AgentGym's own task lists, so the categories our task
  lists give them do not describe those tasks.
- The server takes a bare action, so the reply's action is extracted here, as AgentGym's
  clients do (`parsing.extract_action`); a reply with none is answered here, flagged
  `invalid_action`, and nothing is sent. Whether the server accepted an action is not in the
  protocol, so `invalid_action` is False otherwise.
- Rewards are the server's, except SciWorld's, which are made our default "score" rewards
  (the change of max(score, 0) / 100), so that both servers train alike. `success`: BabyAI a
  positive final reward, TextCraft a reward of 1, SciWorld a score of 100.
- There is no expert and no list of actions (`expert_action` and `available_actions` are None).
- AgentGym's servers answer a failed call with status 200 and `{"error": ...}`; that raises
  `RemoteEnvError` with their message, which the rollout engine records with the episode.
"""

from __future__ import annotations

import random
from typing import Any

from .base import EnvStateError, StepResult, TextEnv, parse_item_index
from .parsing import extract_action
from .remote import RemoteEnvError, ServerConnection

#: The environments whose AgentGym servers this client speaks to, by our id: the name each
#: server's `GET /` gives.
SERVER_NAMES = {"babyai": "BabyAI", "textcraft": "TextCraft", "sciworld": "ScienceWorld"}

NO_ACTION = "Your reply held no action. Reply with one action."


class AgentGymEnv(TextEnv):
    """A client of one instance on an AgentGym env server (see the module docstring).

    Args:
        env_id: which environment the server serves ("babyai", "textcraft" or "sciworld").
        server: the connection to it, shared by the environments of a rollout.
        instruction: the system prompt (AgentGym's servers have none to give).
        max_turns: the default horizon.
        train_items: the items `reset` picks from when given none.
    """

    def __init__(self, env_id: str, server: ServerConnection, instruction: str, max_turns: int,
                 train_items: list[int]):
        if env_id not in SERVER_NAMES:
            raise ValueError(f"AgentGym servers are spoken to for {', '.join(SERVER_NAMES)}, not {env_id!r}")
        self.env_id, self.server, self.instruction, self.max_turns = env_id, server, instruction, max_turns
        self.train_items = train_items
        self._id: int | None = None
        self._info: dict[str, Any] = {}
        self._score = 0.0
        self._done = True

    def _post(self, path: str, body: dict | None, retry: bool = True) -> Any:
        answer = self.server.call("POST", path, body, retry=retry)
        if isinstance(answer, dict) and "error" in answer:
            raise RemoteEnvError(f"{self.server.url}{path}: the server answered: {str(answer['error'])[:300]}")
        return answer

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if item_id is None:
            index = random.Random(seed).choice(self.train_items)
        else:
            index = parse_item_index(item_id, self.env_id)
        if self._id is None:
            created = self._post("/create", {"commands": None, "goal": None} if self.env_id == "textcraft" else None)
            self._id = created["id"]
        answer = self._post("/reset", {"id": self._id, "data_idx": index})
        try:
            observation = answer["observation"]
            if self.env_id == "sciworld":  # the task comes apart from the first look
                observation = f"{answer['task_description']}\n{observation}"
            self._score = float(answer.get("score", 0.0))
        except (KeyError, TypeError, ValueError):
            raise RemoteEnvError(f"{self.server.url}/reset: malformed answer {str(answer)[:200]}") from None
        self._info = {"item_id": f"{self.env_id}_{index}"}
        self._done = False
        return observation, {**self._info, "success": False}

    def step(self, action: str) -> StepResult:
        if self._id is None or not self._info:
            raise EnvStateError("call reset before step")
        if self._done:
            raise EnvStateError("the episode has ended; call reset")
        command = extract_action(action or "")
        if command is None:
            return NO_ACTION, 0.0, False, False, {**self._info, "success": False, "invalid_action": True}
        answer = self._post("/step", {"id": self._id, "action": " ".join(command.split())}, retry=False)
        try:
            observation, reward, done = answer["observation"], float(answer["reward"]), answer["done"]
            score = float(answer.get("score", 0.0))
        except (KeyError, TypeError, ValueError):
            raise RemoteEnvError(f"{self.server.url}/step: malformed answer {str(answer)[:200]}") from None
        if not (isinstance(observation, str) and isinstance(done, bool)):
            raise RemoteEnvError(f"{self.server.url}/step: malformed answer {str(answer)[:200]}")
        if self.env_id == "sciworld":
            reward = (max(score, 0.0) - max(self._score, 0.0)) / 100
            success = score >= 100
        elif self.env_id == "textcraft":
            success = reward >= 1
        else:
            success = done and reward > 0
        self._score, self._done = score, done
        return observation, reward, done, False, {**self._info, "success": success, "invalid_action": False}

    def close(self) -> None:
        """Close the server's instance (once); never raises."""
        if self._id is not None:
            try:
                self.server.call("POST", "/close", {"id": self._id}, retry=False)
            except (RemoteEnvError, EnvStateError):
                pass
            self._id = None
        self._done = True
