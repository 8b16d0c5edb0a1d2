"""`MCPEnv`: the tools of an MCP server as the actions of a text environment, through the
official `mcp` Python SDK.

Each instance starts (stdio: `server` is a command line) or reaches (`server` is an http(s) URL
of a streamable-HTTP server) its own MCP session, lists the server's tools, and tells the agent
about them in its instruction: name, description and the JSON Schema of the arguments. A reply
holds one tool call in the chat-template style of Qwen and Hermes,

    <tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>

(a bare JSON object with "name" and "arguments" is taken too; the last call counts). The tool's
result is the next observation. The environment adds one tool of its own, `final_answer`
({"answer": ...}), which ends the episode: the task's checker compares it with the task's answer
(numbers by value, text case- and space-insensitively) and the reward is 1 or 0. A reply with
no call, an unknown tool, arguments the tool rejects or a tool that fails are explained in the
observation and flagged `invalid_action`: they never raise.

Tasks come from `task_file`, JSON lines of {"instruction", "answer", "category", "split"
("train" or "test"), optionally "solution": the tool calls that solve it, which the expert
replays}; without one, the built-in arithmetic tasks of the bundled calculator server
(`calculator.py`, the default `server`). The server command and the task file come from a config
or the command line, never from a request (`EnvSpec.safe_kwargs` lists none).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shlex
import sys
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..base import EnvStateError, StepResult, TextEnv, parse_item_index
from ..tasks import Task

CALCULATOR = f"{shlex.quote(sys.executable)} -m agentgym_rl.envs.mcp.calculator"
"""The default server: the bundled calculator, over stdio."""

FINAL_ANSWER = "final_answer"
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
BUILTIN_TEST, BUILTIN_TRAIN = 50, 1000
"""Built-in arithmetic tasks: items 0-49 are the test split, 50-1049 the train split."""


# ------------------------------------------------------------------------------------ tasks
def builtin_task(index: int) -> dict[str, Any]:
    """Arithmetic task `index`: "(a + b) * c" or "(a - b) * c", with the calls that solve it."""
    rng = random.Random(f"mcp-calculator-{index}")
    a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
    first = "add" if index % 2 == 0 else "subtract"
    middle = a + b if first == "add" else a - b
    sign = "+" if first == "add" else "-"
    return {"instruction": f"Compute ({a} {sign} {b}) * {c} with the tools, then give the result.",
            "answer": str(middle * c), "category": first,
            "solution": [{"name": first, "arguments": {"a": a, "b": b}},
                         {"name": "multiply", "arguments": {"a": middle, "b": c}}]}


@lru_cache(maxsize=8)
def _file_tasks(path: str) -> tuple[dict[str, Any], ...]:
    tasks = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from None
        if not isinstance(task, dict) or not isinstance(task.get("instruction"), str) or "answer" not in task:
            raise ValueError(f"{path}:{number}: a task is an object with \"instruction\" and \"answer\"")
        if task.get("split", "test") not in ("train", "test"):
            raise ValueError(f"{path}:{number}: split must be train or test")
        tasks.append(task)
    if not tasks:
        raise ValueError(f"{path} holds no task")
    return tuple(tasks)


def _task(task_file: str | None, index: int) -> dict[str, Any]:
    if task_file is None:
        return builtin_task(index)
    tasks = _file_tasks(task_file)
    if index >= len(tasks):
        raise ValueError(f"item {index}: {task_file} holds {len(tasks)} tasks")
    return tasks[index]


def mcp_tasks(split: str, task_file: str | None = None, **_: Any) -> list[Task]:
    """The items of `split`: a task file's by their "split" (default test), else the built-in
    arithmetic tasks."""
    if task_file is None:
        indices = range(BUILTIN_TEST) if split == "test" else range(BUILTIN_TEST, BUILTIN_TEST + BUILTIN_TRAIN)
        return [Task("mcp", i, builtin_task(i)["category"]) for i in indices]
    return [Task("mcp", i, str(task.get("category", "task"))) for i, task in enumerate(_file_tasks(task_file))
            if task.get("split", "test") == split]


# ------------------------------------------------------------------------------ replies
def parse_tool_call(reply: str) -> tuple[str, dict[str, Any]] | str:
    """(tool name, arguments) of a reply's last tool call, or why there is none: the last
    <tool_call> block, else the last JSON object in the reply that names a tool."""
    tagged = TOOL_CALL.findall(reply)
    texts = tagged[-1:] if tagged else [reply[m.start():] for m in reversed(list(re.finditer(r"\{", reply)))]
    decoder = json.JSONDecoder()
    for text in texts:
        try:
            call, _ = decoder.raw_decode(text)
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):  # some templates write the arguments as a JSON string
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return "the arguments are not a JSON object"
            if not isinstance(arguments, dict):
                return "the arguments are not a JSON object"
            return call["name"], arguments
    return 'no tool call: reply with <tool_call>{"name": TOOL, "arguments": {...}}</tool_call>'


def answers_match(given: Any, expected: Any) -> bool:
    """Numbers by value (35 and "35.0" match), anything else as text, case and spaces aside."""
    try:
        return abs(float(given) - float(expected)) <= 1e-6 * max(1.0, abs(float(expected)))
    except (TypeError, ValueError):
        return " ".join(str(given).lower().split()) == " ".join(str(expected).lower().split())


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# -------------------------------------------------------------------------- environment
class _Session:
    """One MCP client session on an event loop of its own thread, so that a synchronous
    environment can call it: entered and left by one task, called from any thread."""

    def __init__(self, server: str, timeout: float):
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        self._devnull = None
        if server.startswith(("http://", "https://")):
            target: Any = server
        else:
            command = shlex.split(server)
            if not command:
                raise ValueError("server is empty: give a command line or an http(s) URL")
            # The server's stderr goes to this process' own (a file descriptor), even when
            # sys.stderr is a stream without one (a notebook, a captured command).
            if sys.__stderr__ is None:
                self._devnull = open(os.devnull, "w")
            target = stdio_client(StdioServerParameters(command=command[0], args=command[1:]),
                                  errlog=sys.__stderr__ or self._devnull)
        self.timeout = timeout
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp-session", daemon=True)
        self.thread.start()
        self._closing: asyncio.Event | None = None
        self._left = threading.Event()  # the session's `Client` has exited (its server with it)
        ready: asyncio.Future = self.loop.create_future()

        async def hold() -> None:
            self._closing = asyncio.Event()
            try:
                async with Client(target) as client:
                    self.client = client
                    ready.set_result(None)
                    await self._closing.wait()
            except BaseException as error:  # noqa: BLE001 — said by the constructor
                if not ready.done():
                    ready.set_exception(error)
            finally:
                self._left.set()

        self._held = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        try:
            asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(ready), timeout), self.loop).result()
        except Exception as error:
            self.close()
            raise ValueError(f"cannot start an MCP session with {server!r}: {type(error).__name__}: {error}") from None

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, self.timeout), self.loop).result()

    def close(self) -> None:
        """Leave the session (its stdio server exits with it) and stop the loop's thread. A
        session still starting is cancelled, which leaves its `Client` the same way."""
        if self.loop.is_closed():
            return
        if self._closing is not None:
            self.loop.call_soon_threadsafe(self._closing.set)
        if not self._left.wait(timeout=10):  # still starting: cancelled, which leaves `Client` as well
            self.loop.call_soon_threadsafe(self._held.cancel)
            self._left.wait(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()
        if self._devnull is not None:
            self._devnull.close()


class MCPEnv(TextEnv):
    """The tools of one MCP server as actions (module docstring).

    Args:
        server: a command line that starts an MCP server over stdio, or the URL of a
            streamable-HTTP one (default: the bundled calculator).
        task_file: JSON lines of tasks (None: the built-in arithmetic tasks).
        timeout: seconds a tool call (and the session's start) may take.
        max_observation_chars: a tool result longer than this is cut, saying so.
    """

    env_id = "mcp"
    instruction = "Solve the task with the tools of an MCP server, one tool call a reply."

    def __init__(self, server: str = CALCULATOR, task_file: str | None = None, timeout: float = 30.0,
                 max_observation_chars: int = 2000):
        if task_file is not None:
            _file_tasks(task_file)  # a bad file is a ValueError now, before any server starts
        self.task_file, self.max_observation_chars = task_file, max_observation_chars
        self._session = _Session(server, timeout)
        try:
            listed = self._session.call(self._session.client.list_tools())
        except Exception as error:
            self.close()
            raise ValueError(f"the MCP server {server!r} did not list its tools: {type(error).__name__}: "
                             f"{error}") from None
        self.tools = {tool.name: tool for tool in listed.tools}
        if FINAL_ANSWER in self.tools:
            self.close()
            raise ValueError(f"the server has a tool named {FINAL_ANSWER!r}, which this environment keeps for answers")
        described = "\n".join(f"- {tool.name}: {tool.description or ''} Arguments (JSON Schema): "
                              f"{json.dumps(getattr(tool, 'inputSchema', None) or getattr(tool, 'input_schema', {}))}"
                              for tool in self.tools.values())
        self.instruction = (
            f"You solve a task with tools. Reply with exactly one tool call a turn, in this form:\n"
            f'<tool_call>{{"name": "TOOL", "arguments": {{...}}}}</tool_call>\n'
            f"The tools:\n{described}\n"
            f"- {FINAL_ANSWER}: give your answer and end the task. Arguments: {{\"answer\": \"...\"}}")
        self._task: dict[str, Any] | None = None
        self._done = True
        self._solved = 0  # the expert's place in the task's solution

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if item_id is None:
            tests = mcp_tasks("test", self.task_file)
            if not tests:
                raise ValueError(f"{self.task_file} has no test task to draw from: give an item id")
            index = random.Random(seed).choice(tests).index
        else:
            index = parse_item_index(item_id, self.env_id)
        self._task, self._index, self._done, self._solved = _task(self.task_file, index), index, False, 0
        return f"Task: {self._task['instruction']}", self._info()

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {"item_id": f"{self.env_id}_{self._index}", **extra}

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise EnvStateError("call reset first: no episode is running")
        parsed = parse_tool_call(action)
        if isinstance(parsed, str):
            return parsed, 0.0, False, False, self._info(success=False, invalid_action=True)
        name, arguments = parsed
        if name == FINAL_ANSWER:
            self._done = True
            right = answers_match(arguments.get("answer"), self._task["answer"])
            said = "Correct." if right else "That is not the answer."
            return said, float(right), True, False, self._info(success=right, invalid_action=False)
        if name not in self.tools:
            known = ", ".join([*self.tools, FINAL_ANSWER])
            return (f"unknown tool {name[:60]!r}; the tools: {known}", 0.0, False, False,
                    self._info(success=False, invalid_action=True))
        try:
            result = self._session.call(self._session.client.call_tool(name, arguments))
        except Exception as error:  # noqa: BLE001 — a failed call is an observation
            return (f"the call failed: {type(error).__name__}: {str(error)[:300]}", 0.0, False, False,
                    self._info(success=False, invalid_action=True))
        text = "\n".join(getattr(part, "text", str(part)) for part in result.content)
        if len(text) > self.max_observation_chars:
            text = text[: self.max_observation_chars] + f" [cut at {self.max_observation_chars} characters]"
        if result.is_error:
            return f"error: {text}", 0.0, False, False, self._info(success=False, invalid_action=True)
        solution = self._task.get("solution") or []
        if (self._solved < len(solution) and solution[self._solved]["name"] == name
                and solution[self._solved].get("arguments", {}) == arguments):
            self._solved += 1
        return f"{name} returned: {text}", 0.0, False, False, self._info(success=False, invalid_action=False)

    def expert_action(self) -> str | None:
        """The task's next solution call, then its answer (None without a solution)."""
        if self._task is None or self._done or "solution" not in self._task:
            return None
        solution = self._task["solution"]
        if self._solved < len(solution):
            step = solution[self._solved]
            return tool_call_text(step["name"], step.get("arguments", {}))
        return tool_call_text(FINAL_ANSWER, {"answer": str(self._task["answer"])})

    def close(self) -> None:
        session, self._session = getattr(self, "_session", None), None
        if session is not None:
            session.close()
