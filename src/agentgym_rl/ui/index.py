"""What the viewer knows of a runs folder: its runs, and one short summary per trajectory line.

Trajectory files are large (every token id, mask and logprob of every episode), so a file is
parsed once and its summaries kept, keyed by the file's size and modification time; a file
that only grew since (a run still training) is read from where the last read stopped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..http_guards import excerpt
from ..runs import CONFIG, METRICS

SPLITS = ("trajectories", "validation")
"""The run sub-folders that hold trajectory files `step_NNNNNN.jsonl`."""

SUMMARY_FIELDS = ("env_id", "item_id", "category", "success", "reward", "turns", "invalid_actions", "error")


class NotFound(LookupError):
    """A run, file or line that the runs folder does not hold."""


def within(path: Path, folder: Path) -> bool:
    """Whether `path`, every link in it followed, is `folder` or lies under it: the viewer reads
    no file whose real place is outside the runs folder, whatever a link inside it points to."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


MAX_DEPTH = 3
"""How deep under the runs folder runs are looked for: `runs/NAME`, and runs grouped in
sub-folders such as `runs/compare/grpo_seed0` (what `agentgym-rl compare` writes)."""


def _holds_run(path: Path) -> bool:
    return (path / CONFIG).is_file()


def _is_run(path: Path, runs_dir: Path, parts: tuple[str, ...]) -> bool:
    """`path` (= runs_dir/parts) holds a run, reached through no link, and no folder above it
    under `runs_dir` is a run itself (a run's own sub-folders, e.g. its `bench/`, are not runs)."""
    try:
        if path.resolve() != runs_dir.resolve().joinpath(*parts):
            return False  # a link somewhere on the way
    except (OSError, RuntimeError):  # a link loop
        return False
    if not (_holds_run(path) and within(path / CONFIG, path)):
        return False
    return not any(_holds_run(runs_dir.joinpath(*parts[:depth])) for depth in range(1, len(parts)))


def resolve_run(runs_dir: Path, name: str) -> Path:
    """The run folder `runs_dir/name`, where `name` is a run's folder or its path under `runs_dir`
    (`compare/grpo_seed0`); nothing outside `runs_dir`, no link on the way, no path tricks."""
    parts = tuple(name.split("/")) if name else ()
    if (not parts or len(parts) > MAX_DEPTH or "\\" in name or "\0" in name
            or any(part in ("", ".", "..") for part in parts)):
        raise NotFound(f"no run named {excerpt(name)!r}")
    path = runs_dir.joinpath(*parts)
    try:
        found = _is_run(path, runs_dir, parts)
    except OSError:  # a name the file system refuses (too long, ...)
        found = False
    if not found:
        raise NotFound(f"no run named {excerpt(name)!r}")
    return path


def run_name(runs_dir: Path, run_dir: Path) -> str:
    """A run's name in the viewer: its path under `runs_dir`, with `/` between folders."""
    return run_dir.relative_to(runs_dir).as_posix()


def list_runs(runs_dir: Path) -> list[Path]:
    """Run folders under `runs_dir` (children with a config.yaml, and those of sub-folders up to
    `MAX_DEPTH` deep; none reached through a link, none inside another run), newest first."""
    if not runs_dir.is_dir():
        return []
    found: list[Path] = []

    def visit(folder: Path, parts: tuple[str, ...]) -> None:
        try:
            children = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            if child.is_symlink() or not child.is_dir():
                continue
            inner = (*parts, child.name)
            if _holds_run(child):
                if _is_run(child, runs_dir, inner):
                    found.append(child)
            elif len(inner) < MAX_DEPTH:
                visit(child, inner)

    visit(runs_dir, ())
    return sorted(found, key=lambda p: (p / CONFIG).stat().st_mtime, reverse=True)


def trajectory_files(run_dir: Path) -> list[tuple[str, int, Path]]:
    """(split, step, path) of every `<split>/step_N.jsonl` of a run, by split then step; a file
    (or split folder) that links out of the run folder is left out."""
    found = []
    for split in SPLITS:
        for path in sorted((run_dir / split).glob("step_*.jsonl")):
            if not within(path, run_dir):
                continue
            try:
                step = int(path.stem.rsplit("_", 1)[-1])
            except ValueError:
                continue
            found.append((split, step, path))
    return found


_HEAD_END = b', "messages": '
_TAIL_START = b'"turn_rewards": '


def _summary_parts(raw: bytes) -> dict[str, Any] | None:
    """The summary fields of a line as `Trajectory.to_json` writes it, parsed from its first
    and last few hundred bytes only; None when the line is not laid out so.

    The record's keys come in a fixed order: the small ones, then "messages" and the token
    lists (nearly all of the bytes), then "turn_rewards" and the small ones again. A quote
    inside a JSON string is escaped, so `"turn_rewards": ` found with its quotes is the key.
    """
    if not raw.startswith(b'{"env_id": '):
        return None
    head_end, tail_start = raw.find(_HEAD_END), raw.rfind(_TAIL_START)
    if head_end < 0 or tail_start < head_end:
        return None
    try:
        head = orjson.loads(raw[:head_end] + b"}")
        tail = orjson.loads(b"{" + raw[tail_start:])
    except orjson.JSONDecodeError:
        return None
    return {**head, **tail} if isinstance(head, dict) and isinstance(tail, dict) else None


def summarize_line(raw: bytes) -> dict[str, Any]:
    """The summary fields of one trajectory line; a line that is not a JSON object is
    summarised as `{"malformed": reason}` (shown as such, never an error)."""
    data = _summary_parts(raw)
    if data is not None:
        return _summary(data)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return {"malformed": f"not JSON ({error.msg}, {len(raw)} bytes)"}
    if not isinstance(data, dict):
        return {"malformed": f"a JSON {type(data).__name__}, not an object"}
    return _summary(data)


def _summary(data: dict[str, Any]) -> dict[str, Any]:
    summary = {key: data.get(key) for key in SUMMARY_FIELDS}
    if summary["turns"] is None and isinstance(data.get("turn_rewards"), list):
        summary["turns"] = len(data["turn_rewards"])
    return summary


@dataclass
class _FileSummaries:
    size: int = 0
    mtime: float = 0.0
    offsets: list[int] = field(default_factory=list)
    """Byte offset of each line: the complete ones, then the unfinished last one if any."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    read_to: int = 0
    """Offset after the last complete line."""


class TrajectoryIndex:
    """Summaries of every trajectory line under a runs folder, cached per file (thread-safe)."""

    def __init__(self) -> None:
        self._files: dict[Path, _FileSummaries] = {}
        self._lock = threading.Lock()

    def summaries(self, path: Path) -> list[dict[str, Any]]:
        """One summary per line of `path`. A last line without its newline is being written or
        was cut off: summarised as it reads now (malformed if it does not parse) and read again
        next time."""
        stat = path.stat()
        with self._lock:
            cached = self._files.get(path)
            if cached and cached.size == stat.st_size and cached.mtime == stat.st_mtime:
                return cached.rows
            if cached is None or stat.st_size < cached.read_to:
                cached = _FileSummaries()
            complete = len(cached.offsets) if cached.size == cached.read_to else len(cached.offsets) - 1
            del cached.offsets[complete:], cached.rows[complete:]
            with path.open("rb") as f:
                f.seek(cached.read_to)
                data = f.read()
            *lines, tail = data.split(b"\n")
            position = cached.read_to
            for raw in lines:
                cached.offsets.append(position)
                cached.rows.append(summarize_line(raw) if raw.strip() else {"malformed": "an empty line"})
                position += len(raw) + 1
            cached.read_to = position
            if tail.strip():
                cached.offsets.append(position)
                summary = summarize_line(tail)
                if "malformed" in summary:
                    summary["malformed"] = f"an unfinished last line (still being written, or cut off): " \
                                           f"{summary['malformed']}"
                cached.rows.append(summary)
            cached.size, cached.mtime = cached.read_to + len(tail), stat.st_mtime
            self._files[path] = cached
            return cached.rows

    def warm(self, runs_dir: Path) -> None:
        """Summarise every trajectory file of every run, newest run first (the viewer does this
        in a background thread at start, so that the first listing finds them summarised)."""
        for run_dir in list_runs(runs_dir):
            for _, _, path in trajectory_files(run_dir):
                try:
                    self.summaries(path)
                except OSError:  # removed meanwhile: the request that needs it will say so
                    continue

    def line(self, path: Path, number: int) -> bytes:
        """The raw bytes of line `number` (0-based) of `path`."""
        rows = self.summaries(path)
        if not 0 <= number < len(rows):
            raise NotFound(f"{path.name} has no line {number}")
        offset = self._files[path].offsets[number]
        with path.open("rb") as f:
            f.seek(offset)
            return f.readline().rstrip(b"\n")


def metrics_rows(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The run's metrics lines and a note per malformed one (a run being written may end in half
    a line)."""
    path = run_dir / METRICS
    rows, problems = [], []
    if not path.is_file():
        return rows, problems
    if not within(path, run_dir):
        return rows, ["metrics.jsonl links out of the run folder: not read"]
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError:
            problems.append(f"metrics.jsonl line {number} is not JSON")
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            problems.append(f"metrics.jsonl line {number} is not a JSON object")
    return rows, problems
