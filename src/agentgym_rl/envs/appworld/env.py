"""`AppWorldEnv`: AppWorld (LOOP's benchmark) through the environment server a user runs.

AppWorld's tasks are everyday requests to a supervisor's apps (Spotify, Venmo, a file system,
...), solved by writing Python that calls `apis.APP.API(...)`. Its data and server are the
user's: install AppWorld and its data, then `appworld serve environment --port 8000`. This
module only speaks that server's HTTP API:

- `POST /initialize {task_id, experiment_name}` -> the task's instruction, supervisor and
  date, which `reset` shows;
- `POST /execute {task_id, code}` -> the code's printed output (or "Execution failed ...");
- `POST /task_completed {task_id}` -> whether the code called
  `apis.supervisor.complete_task(...)`; then `POST /evaluate` scores the task by AppWorld's
  own tests: success when all pass (its "task goal completion"), reward 1;
- `POST /close {task_id}`.

Every answer is wrapped as `{"output": ...}`. The server holds one task at a time, so one
environment instance per server (`max_parallel` 1).

A reply holds one Python block (```python ... ```; the last counts). A reply without one is
answered with how to reply and flagged `invalid_action`; so is code that fails.

Task ids are not listed by the server: they are read from the AppWorld data folder
(`data_root`, default `$APPWORLD_ROOT`): `data/datasets/train.txt` for the train split and
`data/datasets/<test_set>.txt` (default `test_normal`) for the test split; categories are the
tasks' difficulty when their metadata says it. Item i is the i-th of the test ids, then of the
train ids.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import UserError
from ..base import EnvStateError, StepResult, TextEnv, parse_item_index
from ..remote import RemoteEnvError, ServerConnection
from ..tasks import Task

INSTRUCTION = (
    "You are an autonomous agent acting for a supervisor in AppWorld, a world of apps. Each turn, write one "
    "Python code block (```python ... ```); it runs in a persistent interpreter and you see what it prints. "
    "Call the apps as apis.APP_NAME.API_NAME(...). print(apis.api_docs.show_app_descriptions()) lists the apps, "
    "print(apis.api_docs.show_api_descriptions(app_name=...)) an app's APIs and "
    "print(apis.api_docs.show_api_doc(app_name=..., api_name=...)) one API. When the task is done, call "
    "apis.supervisor.complete_task(answer=...) (give an answer only when the task asks a question)."
)

CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
SPLIT_FILES = {"train": "train"}


def _data_root(data_root: str | None) -> Path:
    root = data_root or os.environ.get("APPWORLD_ROOT")
    if not root:
        raise UserError("environment 'appworld' needs the user's AppWorld data: set env.kwargs.data_root (or "
                        "$APPWORLD_ROOT) to the folder holding data/datasets and data/tasks")
    return Path(root)


@lru_cache(maxsize=8)
def _task_ids(root: Path, test_set: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(test ids, train ids) from the AppWorld data folder."""
    found = []
    for name in (test_set, "train"):
        path = root / "data" / "datasets" / f"{name}.txt"
        if not path.is_file():
            raise UserError(f"AppWorld data: no task list {path} (set env.kwargs.data_root, and test_set to one of "
                            "test_normal, test_challenge, dev)")
        found.append(tuple(line.strip() for line in path.read_text().splitlines() if line.strip()))
    return found[0], found[1]


def _difficulty(root: Path, task_id: str) -> str:
    path = root / "data" / "tasks" / task_id / "ground_truth" / "metadata.json"
    try:
        return f"difficulty {json.loads(path.read_text())['difficulty']}"
    except (OSError, ValueError, KeyError):
        return "appworld"


def appworld_tasks(split: str, data_root: str | None = None, test_set: str = "test_normal") -> list[Task]:
    root = _data_root(data_root)
    test, train = _task_ids(root, test_set)
    ids, offset = (test, 0) if split == "test" else (train, len(test))
    return [Task("appworld", offset + i, _difficulty(root, task_id)) for i, task_id in enumerate(ids)]


def code_of(reply: str) -> str | None:
    """The last Python block of a reply, or None when it has none (or an empty one)."""
    blocks = CODE_BLOCK.findall(reply)
    code = blocks[-1].strip() if blocks else ""
    return code or None


class AppWorldEnv(TextEnv):
    """AppWorld through a user-run environment server (see the module docstring).

    Args:
        url: the server (`appworld serve environment --port 8000`).
        data_root: the AppWorld data folder (default `$APPWORLD_ROOT`), for the task ids.
        test_set: the dataset the test split reads: test_normal, test_challenge or dev.
        experiment_name: the name AppWorld files the episodes' outputs under.
        timeout: seconds to wait for one answer (AppWorld's own code timeout is 100 s).
    """

    env_id = "appworld"
    instruction = INSTRUCTION

    def __init__(self, url: str = "http://127.0.0.1:8000", data_root: str | None = None,
                 test_set: str = "test_normal", experiment_name: str = "agentgym_rl", timeout: float = 120.0):
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self._root = _data_root(data_root)
        self._test, self._train = _task_ids(self._root, test_set)
        self._server = ServerConnection(url, token="", timeout=timeout)
        try:
            self._server.call("GET", "/")
        except RemoteEnvError as error:
            self._server.close()
            raise UserError(f"no AppWorld environment server answers at {url} (start one with `appworld serve "
                            f"environment --port 8000`): {error}") from None
        self.experiment_name = experiment_name
        self._task_id: str | None = None
        self._info: dict[str, Any] = {}
        self._done = True

    def _call(self, path: str, **body: Any) -> Any:
        return self._server.call("POST", path, {"task_id": self._task_id, **body}, retry=False)["output"]

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        ids = self._test + self._train
        index = parse_item_index(item_id, self.env_id) if item_id is not None else (seed or 0) % len(ids)
        if index >= len(ids):
            raise ValueError(f"appworld has items 0..{len(ids) - 1}, got {item_id}")
        self._close_task()
        self._task_id = ids[index]
        task = self._call("/initialize", experiment_name=self.experiment_name)
        supervisor = task.get("supervisor") or {}
        observation = (f"Task: {task['instruction']}\n"
                       f"Supervisor: {supervisor.get('first_name', '')} {supervisor.get('last_name', '')}, "
                       f"email {supervisor.get('email', '')}, phone {supervisor.get('phone_number', '')}.\n"
                       f"Date and time: {task.get('datetime', '')}.")
        self._info = {"item_id": f"appworld_{index}", "task_id": self._task_id}
        self._done = False
        return observation, dict(self._info)

    def step(self, action: str) -> StepResult:
        if self._task_id is None or self._done:
            raise EnvStateError("reset before step" if self._task_id is None else "the episode has ended")
        info = {**self._info, "success": False, "invalid_action": False}
        code = code_of(action)
        if code is None:
            info["invalid_action"] = True
            return "Reply with one Python code block: ```python\n...\n```", 0.0, False, False, info
        output = str(self._call("/execute", code=code))
        info["invalid_action"] = output.startswith("Execution failed")
        if not self._call("/task_completed"):
            return output, 0.0, False, False, info
        result = self._call("/evaluate", suppress_errors=True)
        self._done = True
        info["success"] = bool(result.get("success"))
        info["tests_passed"], info["num_tests"] = len(result.get("passes", [])), result.get("num_tests")
        return output, float(info["success"]), True, False, info

    def _close_task(self) -> None:
        if self._task_id is not None:
            # The server may have dropped the task already; the next initialize replaces it anyway.
            with contextlib.suppress(RemoteEnvError):
                self._call("/close")
            self._task_id = None

    def close(self) -> None:
        if getattr(self, "_server", None) is None:
            return
        self._close_task()
        self._server.close()
        self._server = None
