"""The web viewer of a runs folder: `agentgym-rl view [RUNS_DIR]`.

    GET  /                                      the single-page app (static/, shipped in the package)
    GET  /api/runs                              every run: name, env, algorithm, steps, last metrics
    GET  /api/runs/{run}                        its resolved config, metrics lines and their problems
    GET  /api/runs/{run}/trajectories           summaries, filtered and paged (query below)
    GET  /api/runs/{run}/trajectory             one whole trajectory, with its tokens decoded
    GET  /api/envs                              the registered environments
    POST /api/play                              a playground session: an env reset to an item
    POST /api/play/{id}/step                    act by hand
    POST /api/play/{id}/model                   let a run's newest checkpoint, or a served model, act
    DELETE /api/play/{id}

Only files under the runs folder are read: a run is named by its folder name (a direct child),
a trajectory file by its split and step, a line by its number, and a file whose real place (links
followed) is outside the runs folder is not read. A malformed line is listed as such; it is
never an error. Requests must name this machine (or a host given with `--allow-host`) in their
`Host`; the playground talks only to servers given with `--allow-url`, and a request sets only an
environment's safe arguments (`ui/playground.py`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterable

import orjson
from fastapi import FastAPI, HTTPException, Query
from fastapi import Path as PathPart
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from ..config import load_yaml
from ..http_guards import LOOPBACK_HOSTS, RequestGuard, Text, add_error_handlers
from .index import (SPLITS, NotFound, TrajectoryIndex, list_runs, metrics_rows, resolve_run, run_name,
                    trajectory_files, within)
from .playground import MAX_ACTION_CHARS, Playground, PlaygroundError
from .tokens import TokenViews
from .. import metric_names as metric

STATIC = Path(__file__).parent / "static"
MAX_PAGE = 500
MAX_INDEX = 10**12
"""Largest step, line, offset or session a request may name (a JSON answer holds 64-bit integers)."""
SESSION = PathPart(ge=0, le=MAX_INDEX)


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class PlayRequest(BaseModel):
    env_id: Text
    item_id: int | Text | None = None
    url: Text | None = None
    """An env server to play on (`agentgym-rl serve-env`), else the env runs in the viewer."""
    kwargs: dict[str, Any] = Field(default_factory=dict)


class ActRequest(BaseModel):
    action: Text = Field(max_length=MAX_ACTION_CHARS)


class ModelRequest(BaseModel):
    run: Text | None = None
    """The run whose newest checkpoint acts..."""
    endpoint: Text | None = None
    """...or an OpenAI-compatible API (`http://HOST:PORT/v1`, e.g. `agentgym-rl serve-model`)..."""
    model: Text = ""
    """...and the model name it serves."""


def _summary(run_dir: Path, name: str) -> dict[str, Any]:
    try:
        config = load_yaml(run_dir / "config.yaml")
    except Exception:  # a half-written or hand-edited config: list the run anyway
        config = None
    config = config if isinstance(config, dict) else {}
    rows, _ = metrics_rows(run_dir)

    def section(name: str) -> dict[str, Any]:
        value = config.get(name)
        return value if isinstance(value, dict) else {}

    def last(key: str) -> Any:
        return next((row[key] for row in reversed(rows) if key in row), None)

    return {
        "name": name,
        "env": section("env").get("id"),
        "kind": section("algo").get("name"),
        "steps": last("step"),
        "success": last(metric.TRAIN_SUCCESS),
        "validation": last(metric.VAL_SUCCESS),
        "modified": (run_dir / "config.yaml").stat().st_mtime,
    }


def _matches(summary: dict[str, Any], env: str | None, item: str | None, category: str | None,
             success: str | None) -> bool:
    if env and summary.get("env_id") != env:
        return False
    if item and str(summary.get("item_id")) not in (item, f"{summary.get('env_id')}_{item}"):
        return False  # "babyai_12" or just "12"
    if category and summary.get("category") != category:
        return False
    if success in ("true", "false") and ("malformed" in summary or bool(summary.get("success")) != (success == "true")):
        return False
    if success == "malformed" and "malformed" not in summary:
        return False
    return True


def create_app(runs_dir: str | Path, allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
               allowed_urls: Iterable[str] = (), max_body_bytes: int = 1_000_000,
               env_settings: dict[str, dict[str, Any]] | None = None) -> FastAPI:
    """The viewer app over `runs_dir` (read at every request: new runs and steps appear).

    Args:
        allowed_hosts: the names a request's `Host` may carry (the viewer has no login: a page
            of another site that rebinds its name to this address is refused).
        allowed_urls: the servers the playground may talk to (this machine's too).
        max_body_bytes: larger request bodies are refused with 413.
        env_settings: env id -> the arguments its playground sessions get (`view --env-arg`).
    """
    runs_dir = Path(runs_dir)
    index = TrajectoryIndex()
    app = FastAPI(title="agentgym-rl viewer", default_response_class=JSON)
    app.add_middleware(RequestGuard, max_body_bytes=max_body_bytes, allowed_hosts=allowed_hosts)
    add_error_handlers(app)
    threading.Thread(target=index.warm, args=(runs_dir,), name="index-runs", daemon=True).start()

    @app.get("/", include_in_schema=False)
    def home() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _add_run_routes(app, runs_dir, index, TokenViews())

    @app.get("/api/metrics")
    def metric_names() -> dict[str, Any]:
        """The metric names the page needs: the curve to show first, and what each key means."""
        return {"preferred": list(metric.PREFERRED_CURVES), "described": metric.DOCS}

    _add_play_routes(app, runs_dir, Playground(allowed_urls, env_settings))
    return app


def _run_folder(runs_dir: Path, name: str) -> Path:
    try:
        return resolve_run(runs_dir, name)
    except NotFound as error:
        raise HTTPException(404, str(error)) from None


def _file_of(run: Path, split: str, step: int) -> Path:
    if split not in SPLITS:
        raise HTTPException(422, f"split must be one of {', '.join(SPLITS)}")
    path = run / split / f"step_{step:06d}.jsonl"
    if not path.is_file() or not within(path, run):
        raise HTTPException(404, f"run {run.name!r} has no {split} of step {step}")
    return path


def _add_run_routes(app: FastAPI, runs_dir: Path, index: TrajectoryIndex, tokens: TokenViews) -> None:
    """The routes that read runs: the list, one run, its trajectories and one of them."""

    @app.get("/api/runs")
    def runs() -> dict[str, Any]:
        return {"runs_dir": str(runs_dir), "runs": [_summary(p, run_name(runs_dir, p)) for p in list_runs(runs_dir)]}

    @app.get("/api/runs/{name:path}/trajectories")
    def trajectories(name: str, split: str | None = None, step: int | None = Query(None, ge=0, le=MAX_INDEX),
                     env: str | None = None, item: str | None = None, category: str | None = None,
                     success: str | None = Query(None, pattern="^(true|false|malformed)$"),
                     offset: int = Query(0, ge=0, le=MAX_INDEX),
                     limit: int = Query(100, ge=1, le=MAX_PAGE)) -> dict[str, Any]:
        folder = _run_folder(runs_dir, name)
        if split is not None and split not in SPLITS:
            raise HTTPException(422, f"split must be one of {', '.join(SPLITS)}")
        matched: list[dict[str, Any]] = []
        categories: set[str] = set()
        total = 0
        for file_split, file_step, path in trajectory_files(folder):
            if (split and file_split != split) or (step is not None and file_step != step):
                continue
            for line, summary in enumerate(index.summaries(path)):
                if summary.get("category"):
                    categories.add(str(summary["category"]))
                if not _matches(summary, env, item, category, success):
                    continue
                if offset <= total < offset + limit:
                    matched.append({"split": file_split, "step": file_step, "line": line, **summary})
                total += 1
        return {"total": total, "offset": offset, "rows": matched, "categories": sorted(categories)}

    @app.get("/api/runs/{name:path}/trajectory")
    def trajectory(name: str, split: str, step: int = Query(ge=0, le=MAX_INDEX),
                   line: int = Query(ge=0, le=MAX_INDEX)) -> dict[str, Any]:
        folder = _run_folder(runs_dir, name)
        path = _file_of(folder, split, step)
        try:
            raw = index.line(path, line)
        except NotFound as error:
            raise HTTPException(404, str(error)) from None
        summary = index.summaries(path)[line]
        if "malformed" in summary:
            return {"malformed": summary["malformed"], "raw": raw[:2000].decode("utf-8", "replace")}
        record = orjson.loads(raw)
        record["tokens"] = tokens.view(folder, record)
        return record

    # After the routes above: a name may hold "/" (runs in sub-folders), `:path` takes any.
    @app.get("/api/runs/{name:path}")
    def run(name: str) -> dict[str, Any]:
        folder = _run_folder(runs_dir, name)
        rows, problems = metrics_rows(folder)
        try:
            config = load_yaml(folder / "config.yaml")
        except Exception as error:
            config, problems = None, [*problems, f"config.yaml: {error}"]
        files = [{"split": split, "step": step, "episodes": len(index.summaries(path))}
                 for split, step, path in trajectory_files(folder)]
        return {"name": name, "config": config, "metrics": rows, "problems": problems, "files": files}


def _add_play_routes(app: FastAPI, runs_dir: Path, playground: Playground) -> None:
    """The playground's routes: environments, their tasks, and sessions played by hand or by a model."""

    @app.get("/api/envs")
    def envs() -> dict[str, Any]:
        return {"envs": playground.env_ids()}

    @app.get("/api/envs/{env_id}/tasks")
    def env_tasks(env_id: str, split: str = "test") -> dict[str, Any]:
        try:
            return {"tasks": playground.tasks(env_id, split)}
        except PlaygroundError as error:
            raise HTTPException(error.status, str(error)) from None

    @app.post("/api/play")
    def play(request: PlayRequest) -> dict[str, Any]:
        try:
            return playground.start(request.env_id, request.item_id, request.kwargs, request.url)
        except PlaygroundError as error:
            raise HTTPException(error.status, str(error)) from None

    @app.post("/api/play/{session}/step")
    def step(request: ActRequest, session: int = SESSION) -> dict[str, Any]:
        try:
            return playground.step(session, request.action)
        except PlaygroundError as error:
            raise HTTPException(error.status, str(error)) from None

    @app.post("/api/play/{session}/model")
    def model_step(request: ModelRequest, session: int = SESSION) -> dict[str, Any]:
        if (request.run is None) == (request.endpoint is None):
            raise HTTPException(422, "name either a run or a model endpoint")
        folder = _run_folder(runs_dir, request.run) if request.run is not None else None
        try:
            return playground.model_step(session, folder, request.endpoint, request.model)
        except PlaygroundError as error:
            raise HTTPException(error.status, str(error)) from None

    @app.delete("/api/play/{session}")
    def close(session: int = SESSION) -> dict[str, Any]:
        playground.close(session)
        return {"closed": session}
