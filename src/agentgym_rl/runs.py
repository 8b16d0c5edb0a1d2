"""A run is a folder: its layout, its writers and its readers.

```
<run.output_dir>/<run.name>/
  .lock              who writes the run now (`run_lock`): its PID and host, empty once it ended
  config.yaml        the resolved config (`played_settings` reads what eval needs of it)
  metrics.jsonl      one JSON line per step (`MetricsLogger`, `read_metrics`)
  tensorboard/       the same scalars for TensorBoard (wandb/ for W&B: `run.loggers`, trackers.py)
  trajectories/      step_000001.jsonl ... rollouts of each RL step
  validation/        step_000000.jsonl ... episodes of each validation
  checkpoints/       step_000044/ (RL), round_001/ (RFT), final/ (SFT, DPO): model/ is an HF folder
  base_model/        the tiny model and tokenizer as built
  warmup_model/      the model after the warm-up, when the config has one
  lora_base/         the model a LoRA adapter wraps, when the config has one
  report/            plots and summaries
```

Trainers write here; evaluation, comparison, plots and resume read here, so reading a run never
imports a trainer.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from .agent.loading import model_damage
from .config import PLAYED_SECTIONS, dump_yaml, load_yaml, to_dict
from .errors import DISK_ERRORS, UserError
from .jsonlines import read_json_lines, warn_on_stderr
from .trackers import open_trackers, scalars
from . import metric_names as metric

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
LOCK = ".lock"
MIN_FREE_BYTES = 256 * 2**20
"""Least free disk space a run starts with (the tiny model's checkpoints are ~12 MB each)."""


def holds_run(run_dir: str | Path) -> bool:
    """Whether a run has already started in `run_dir` (it logged metrics)."""
    return (Path(run_dir) / METRICS).exists()


def start_run(run_dir: str | Path, config: Any, hint: str = "choose a new run.name") -> None:
    """Create the run folder and write `config.yaml`; a folder that holds a run is refused, or
    emptied first when the config says `run.overwrite` (under `run.smoke`, only a smoke run's)."""
    run_dir = Path(run_dir)
    if holds_run(run_dir):
        run = getattr(config, "run", None)
        if not getattr(run, "overwrite", False):
            raise UserError(f"run folder {str(run_dir)!r} already holds a run; {hint}, or --overwrite "
                            "(run.overwrite=true) to start it afresh")
        if getattr(run, "smoke", False) and not _smoke_run(run_dir):
            raise UserError(f"--smoke replaces only a smoke run, and {str(run_dir)!r} holds another run: give "
                            "--smoke a run.name of its own (its default is <run.name>_smoke)")
        _clear_run(run_dir)
    write_config(run_dir, config)


@contextmanager
def run_lock(run_dir: str | Path, log: Callable[[str], object] = warn_on_stderr) -> Iterator[None]:
    """Hold `run_dir`'s lock while the block writes the run: a second writer (a run of the same
    name, `--overwrite`, `--resume`) is refused with one line naming the holder, while readers
    (`eval --run`, `report`, `view`) need no lock.

    The lock is an exclusive `flock` on `run_dir/.lock`, taken atomically and let go by the
    kernel when the holder ends, however it ends; the file says who holds it (PID, host, since)
    and is emptied on release. A file that still names a holder once the lock is free was left by a
    process that died: its lock is taken over with a note. (flock keeps apart the processes of
    one machine; on a network file system, only as far as it passes locks between machines.)

    Raises:
        UserError: another process holds the lock, or the folder cannot be written.
    """
    path = Path(run_dir) / LOCK
    made = not path.parent.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise UserError(f"cannot write the run folder {str(run_dir)!r}: {error.strerror or error}") from None
    with os.fdopen(descriptor, "r+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"run folder {str(run_dir)!r} is in use by {_holder(handle.read())}: wait for it to end "
                            "(or stop it), or choose another run.name") from None
        left = handle.read()
        if left.strip():
            log(f"note: {run_dir} was left locked by {_holder(left)}, which has ended; taking it over")
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()  # the kernel lets the lock go when the file closes
            if made and [child.name for child in path.parent.iterdir()] == [LOCK]:
                shutil.rmtree(path.parent)  # a run that failed before writing anything leaves no folder


def _holder(text: str) -> str:
    """Who a lock file names, in words."""
    try:
        holder = json.loads(text)
        return f"PID {holder['pid']} on {holder['host']} (since {holder['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def _smoke_run(run_dir: Path) -> bool:
    """Whether the run in `run_dir` was started by `--smoke` (its config says `run.smoke`)."""
    try:
        return load_yaml(run_dir / CONFIG).get("run", {}).get("smoke") is True
    except Exception:  # noqa: BLE001 — no config, or a broken one: not known to be a smoke run
        return False


def _clear_run(run_dir: Path) -> None:
    """Delete a run folder's contents for `run.overwrite`; never a folder that holds the working
    directory or the home folder (a run.name of "." would name one)."""
    real = run_dir.resolve()
    if any(real == place or real in place.parents for place in (Path.cwd().resolve(), Path.home().resolve())):
        raise UserError(f"--overwrite would delete {str(run_dir)!r}, which holds the working directory or the home "
                        "folder; choose a run.name of its own")
    try:
        for child in run_dir.iterdir():
            if child.name == LOCK:  # held by this process: a new file would be a second lock
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    except OSError as error:
        raise UserError(f"cannot empty {str(run_dir)!r} for --overwrite: {error.strerror or error}") from None


def write_config(run_dir: str | Path, config: Any) -> None:
    """Create `run_dir` and write `config.yaml`; a folder that cannot be written, or a disk with
    less than `MIN_FREE_BYTES` left, is a `UserError` here, before any work."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CONFIG).write_text(dump_yaml(to_dict(config)))
    except OSError as error:
        raise UserError(f"cannot write the run folder {str(run_dir)!r}: {error.strerror or error}") from None
    free = shutil.disk_usage(run_dir).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"only {free / 2**20:.0f} MiB are free on the disk of {str(run_dir)!r}; a run writes "
                        f"checkpoints, trajectories and logs: free at least {MIN_FREE_BYTES / 2**20:.0f} MiB")



def check_writable(run_dir: Path, doing: str) -> None:
    """A `UserError` saying so when `run_dir` cannot be written (before any work that would)."""
    probe = run_dir / f".write-check-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise UserError(f"cannot {doing} {str(run_dir)!r}: its folder cannot be written ({error.strerror or error}); "
                        "make it writable (or free space on its disk) and try again") from None


def disk_stop(run_dir: Path, error: OSError, resume_hint: str) -> UserError:
    """The one line a run stopped by its disk ends with: what failed, what is saved, how to go on."""
    checkpoint = latest_checkpoint(run_dir)
    saved = (f"its newest checkpoint is {checkpoint.name}" if checkpoint is not None else "no checkpoint was saved")
    return UserError(f"the run stopped: writing {error.filename or 'the run folder'} failed ({error.strerror or error}); "
                     f"{saved}; free space on the disk (or make it writable), then {resume_hint}")


UNTRUSTED_ENV_KEYS = ("reward", "judge", "urls")
"""Keys of a run's `env` section that `eval --run` does not take from its config.yaml: a code
path to import, a URL to send transcripts (and $OPENAI_API_KEY) to, servers to play on are named
on the command line, never by a file in a folder someone may have shared. Of its constructor
arguments (`env.kwargs`), only those a request may set too are taken (`EnvSpec.safe_kwargs`: never
a program, file or URL, as an MCP server's command line)."""


def _trusted_kwargs(env_id: Any, kwargs: Any) -> tuple[dict[str, Any], list[str]]:
    """(the arguments of `kwargs` a request could set too, the names of the others)."""
    from .envs import registry

    if not isinstance(kwargs, dict) or not kwargs:
        return {}, []
    try:
        spec = registry.spec(str(env_id))
    except UserError:  # an environment this process does not know: nothing of it runs here
        return kwargs, []
    if env_id == "mix":
        try:
            return registry.checked_kwargs("mix", kwargs), []
        except ValueError:  # NotSettable too: a member's argument that a request could not set
            return {}, ["members"]
    kept, dropped = {}, []
    for name, value in kwargs.items():
        try:
            kept[name] = spec.safe_kwargs[name].check(f"{env_id}'s {name}", value)
        except (KeyError, ValueError):
            dropped.append(str(name))
    return kept, dropped


def played_settings(run_dir: str | Path, log: Callable[[str], object] = warn_on_stderr) -> dict[str, Any]:
    """The sections of a run's config that say how its policy saw and played the environment
    (env, rollout, eval), its seed and its process' memory setting (`run.malloc_mmap_threshold_kb`:
    a SmolLM2 recipe's "auto" resolves to 1 MiB in an evaluation), as plain data: the base of
    `eval --run`. The env section's `UNTRUSTED_ENV_KEYS` are left out, and `log` says so."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise UserError(f"{str(run_dir)!r} is not a run folder: it has no {CONFIG}")
    data = load_yaml(path)
    header = data.get("run", {})
    run = {"seed": header.get("seed", data.get("seed", 0))}  # runs before the run section: top-level seed
    if "malloc_mmap_threshold_kb" in header:
        run["malloc_mmap_threshold_kb"] = header["malloc_mmap_threshold_kb"]
    played = {k: data[k] for k in PLAYED_SECTIONS if k in data}
    env = played.get("env")
    if isinstance(env, dict):
        named = [f"env.{key}" for key in UNTRUSTED_ENV_KEYS
                 if env.get(key) and (key != "judge" or (isinstance(env[key], dict) and env[key].get("url")))]
        kept, dropped = _trusted_kwargs(env.get("id"), env.get("kwargs"))
        named += [f"env.kwargs.{name}" for name in dropped]
        played["env"] = {**{k: v for k, v in env.items() if k not in UNTRUSTED_ENV_KEYS}, "kwargs": kept}
        if named:
            log(f"note: {', '.join(named)} of the run are not taken from its {CONFIG} (a folder's file names no "
                "program, file or URL to use): give them on the command line (--env-arg, key=value) to use them")
    return {**played, "run": run}


RUN_MODELS = ("base_model", "warmup_model", "lora_base")
"""The model folders a run keeps beside its checkpoints."""


def run_of(model_dir: str | Path) -> Path | None:
    """The run folder a model folder belongs to (`<run>/checkpoints/<name>/model`, or one of
    `RUN_MODELS` in the run folder), or None."""
    path = Path(model_dir).resolve()
    if path.name in RUN_MODELS and (path.parent / CONFIG).is_file():
        return path.parent
    run_dir = path.parents[2] if len(path.parents) > 2 else None
    if path.name == "model" and path.parent.parent.name == "checkpoints" and (run_dir / CONFIG).is_file():
        return run_dir
    return None


def latest_model(run_dir: str | Path, log: Callable[[str], object] = warn_on_stderr) -> Path:
    """The model folder of a run's newest checkpoint: `final/` (SFT, DPO), else the highest
    `step_N/` (RL) or `round_N/` (RFT). A damaged one (a write cut short) is passed over with a
    warning for the one before it, as `train --resume` does."""
    folder = Path(run_dir) / "checkpoints"
    found = ([folder / "final"] if (folder / "final" / "model").is_dir() else
             checkpoints(run_dir) or checkpoints(run_dir, "round_"))
    if not found:
        raise UserError(f"run folder {str(run_dir)!r} has no checkpoint yet")
    for checkpoint in reversed(found):
        damage = model_damage(checkpoint / "model")
        if damage is None:
            return checkpoint / "model"
        log(f"warning: checkpoint {checkpoint} cannot be loaded ({damage}); trying the one before")
    raise UserError(f"none of the {len(found)} checkpoints of {str(run_dir)!r} loads")


def checkpoints(run_dir: str | Path, prefix: str = "step_") -> list[Path]:
    """The run's checkpoint folders named `<prefix>N`, oldest first."""
    return sorted((Path(run_dir) / "checkpoints").glob(f"{prefix}*"))


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` (>= 1) `step_N/` checkpoints of a run; returns the
    folders deleted, oldest first. Nothing is deleted while the newest does not look whole
    (`model_damage`): a write cut short must leave the one before it to resume from."""
    found = checkpoints(run_dir)
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    if len(found) <= keep or model_damage(found[-1] / "model") is not None:
        return []
    for folder in found[:-keep]:
        shutil.rmtree(folder)
    return found[:-keep]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_step(folder: Path) -> int:
    """12 for `.../step_000012`."""
    return int(folder.name.rsplit("_", 1)[-1])


class MetricsLogger:
    """Appends `{"step": s, **metrics}` lines to `metrics.jsonl`; their numbers also go to the
    trackers `run.loggers` names (`trackers.py`: TensorBoard, Weights & Biases, MLflow).

    Args:
        run_dir: the run folder; writes `metrics.jsonl` in it (and `tensorboard/`, `wandb/`).
        loggers: the trackers' names.
        config: the run's config (a dataclass), given to the W&B and MLflow runs.
        resumed_at: the checkpoint's step when the run is resumed.
    """

    def __init__(self, run_dir: str | Path, loggers: list[str] | tuple[str, ...] = ("tensorboard",),
                 config: Any = None, resumed_at: int | None = None):
        self.path = Path(run_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        name = getattr(getattr(config, "run", None), "name", None) or Path(run_dir).name
        self.trackers = open_trackers(loggers, Path(run_dir), name, to_dict(config) if config is not None else {},
                                      resumed_at)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        numbers = scalars(metrics)
        for tracker in self.trackers:
            tracker.log(step, numbers)

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after `step` (a resumed run re-logs them)."""
        if not self.path.exists():
            return
        kept = [row for row in read_json_lines(self.path) if row["step"] <= step]  # a cut-off last line goes too
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except OSError as error:  # its last flush met the disk that stopped the run: said once already
                if error.errno not in DISK_ERRORS:
                    raise


class NoMetrics:
    """A `MetricsLogger` that writes nothing: the other ranks of a `torchrun` run (rank 0 logs)."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    return read_json_lines(path)


def validated_steps(run_dir: str | Path) -> set[int]:
    """The steps whose validation finished (a `val/success` in `metrics.jsonl`)."""
    return {row["step"] for row in read_metrics(run_dir) if metric.VAL_SUCCESS in row}


def trained_steps(run_dir: str | Path) -> int:
    """The last RL step the run logged (0: none)."""
    return max((row["step"] for row in read_metrics(run_dir) if metric.TRAIN_SUCCESS in row), default=0)
