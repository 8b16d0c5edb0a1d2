"""A stand-in for AppWorld's environment server (`appworld serve environment`) following its
HTTP API (every answer wrapped as {"output": ...}; one task at a time; 400 for a task that is
not the open one), with two apps and a made-up data folder, for testing `AppWorldEnv`
without AppWorld's data."""

from __future__ import annotations

import contextlib
import io
import json
import traceback
from pathlib import Path
from types import SimpleNamespace

from fastapi import Body, FastAPI, HTTPException

# task id -> (instruction, the answer its test expects, difficulty)
TASKS = {
    "a1b2c3d_1": ("What is 2 plus 3? Use the calculator app.", 5, 1),
    "a1b2c3d_2": ("Add 10 and 32 with the calculator app and report the sum.", 42, 2),
    "e4f5a6b_1": ("Send 'hi' to Joyce with the phone app.", None, 3),
}
TEST_IDS, TRAIN_IDS = ["a1b2c3d_1", "e4f5a6b_1"], ["a1b2c3d_2"]


def write_data_root(root: Path) -> Path:
    """AppWorld's data layout: data/datasets/<split>.txt and each task's metadata."""
    datasets = root / "data" / "datasets"
    datasets.mkdir(parents=True)
    (datasets / "test_normal.txt").write_text("\n".join(TEST_IDS) + "\n")
    (datasets / "train.txt").write_text("\n".join(TRAIN_IDS) + "\n")
    for task_id, (_, _, difficulty) in TASKS.items():
        folder = root / "data" / "tasks" / task_id / "ground_truth"
        folder.mkdir(parents=True)
        (folder / "metadata.json").write_text(json.dumps({"difficulty": difficulty}))
    return root


class _World:
    def __init__(self, task_id: str):
        self.task_id, self.answer, self.completed, self.sent = task_id, None, False, []
        self.namespace = {"apis": SimpleNamespace(
            calculator=SimpleNamespace(add=lambda a, b: a + b),
            phone=SimpleNamespace(send_text_message=lambda phone_number, message: self.sent.append(message)),
            api_docs=SimpleNamespace(show_app_descriptions=lambda: "calculator: adds numbers\nphone: texts"),
            supervisor=SimpleNamespace(complete_task=self.complete))}

    def complete(self, answer=None, status="success"):
        self.answer, self.completed = answer, True
        return {"message": "Marked the active task complete."}


def create_fake_appworld() -> FastAPI:
    app = FastAPI()
    state: dict = {"world": None, "calls": []}
    app.state.fake = state

    def world(task_id: str) -> _World:
        state["calls"].append(task_id)
        if state["world"] is None or state["world"].task_id != task_id:
            raise HTTPException(400, f"task {task_id} is not the initialized one")
        return state["world"]

    @app.get("/")
    def welcome():
        return {"message": "Welcome to AppWorld Server!"}

    @app.post("/initialize")
    def initialize(body: dict = Body(...)):
        task_id = body["task_id"]
        if task_id not in TASKS:
            raise HTTPException(400, f"unknown task {task_id}")
        state["world"] = _World(task_id)
        return {"output": {"task_id": task_id, "instruction": TASKS[task_id][0], "datetime": "2023-05-18T12:00:00",
                           "supervisor": {"first_name": "Ann", "last_name": "Lee", "email": "ann@example.com",
                                          "phone_number": "5550100"}}}

    @app.post("/execute")
    def execute(task_id: str = Body(...), code: str = Body(...)):
        current = world(task_id)
        if not code.strip():
            return {"output": "No code available to execute."}
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(code, current.namespace)  # the fake's own toy apps; AppWorld sandboxes real ones
        except Exception:
            return {"output": "Execution failed. Traceback:\n" + traceback.format_exc(limit=1)}
        return {"output": printed.getvalue() or "Execution successful."}

    @app.post("/task_completed")
    def task_completed(task_id: str = Body(..., embed=True)):
        return {"output": world(task_id).completed}

    @app.post("/evaluate")
    def evaluate(task_id: str = Body(...), suppress_errors: bool = Body(False), report: bool = Body(False)):
        current = world(task_id)
        expected = TASKS[task_id][1]
        checks = [("the task was marked complete", current.completed),
                  ("the answer is right" if expected is not None else "the message was sent",
                   current.answer == expected if expected is not None else current.sent == ["hi"])]
        passes = [{"requirement": r, "label": "no_op_fail"} for r, ok in checks if ok]
        failures = [{"requirement": r, "trace": "assert failed", "label": "no_op_fail"} for r, ok in checks if not ok]
        return {"output": {"success": not failures, "difficulty": TASKS[task_id][2], "num_tests": len(checks),
                           "passes": passes, "failures": failures}}

    @app.post("/close")
    def close(task_id: str = Body(..., embed=True)):
        world(task_id)
        state["world"] = None
        return {"output": None}

    return app
