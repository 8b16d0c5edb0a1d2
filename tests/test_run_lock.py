"""A run folder is written by one process at a time (`runs.run_lock`), `--smoke` never replaces a
real run, and resuming reads nothing that can run code: checkpoints load with `weights_only`, and
an in-flight journal is unpickled only under this user's signature."""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli import run
from test_run_safety import REPO, TOY, toy_config

from agentgym_rl.config.smoke import smoke_overrides
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.journal import Journal
from agentgym_rl.train.rl import RLTrainer

HOLD = ("import sys; from agentgym_rl.runs import run_lock\n"
        "with run_lock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()")


class Planted:
    """An object whose unpickling creates `marker`: what a planted file would do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def hold(folder: Path) -> subprocess.Popen:
    """Another process holding `folder`'s lock until its stdin closes (or it is killed)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_run_in_use_is_neither_overwritten_nor_resumed_and_a_dead_holders_lock_is_taken_over(
        tmp_path, counter_env_registered):
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    folder = tmp_path / "toy"
    holder = hold(folder)
    try:
        for resume, extra in ((False, ["run.overwrite=true"]), (True, ["train.steps=2"])):
            with pytest.raises(UserError, match=f"in use by PID {holder.pid} on ") as caught:
                RLTrainer(toy_config(tmp_path, *extra), log=lambda _: None).fit(resume=resume)
            assert "\n" not in str(caught.value)
        second = run("train", str(REPO / "configs" / "babyai_grpo.yaml"), *TOY, f"run.output_dir={tmp_path}",
                     "run.name=toy", "--overwrite")
        assert second.returncode == 2 and f"PID {holder.pid}" in second.stderr
        assert (folder / "metrics.jsonl").exists() and (folder / "checkpoints" / "step_000001").is_dir()
        assert run("report", str(folder)).returncode == 0  # readers need no lock
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    said: list[str] = []
    RLTrainer(toy_config(tmp_path, "train.steps=2"), log=said.append).fit(resume=True)
    assert any(f"left locked by PID {holder.pid}" in line and "taking it over" in line for line in said), said
    assert json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    assert (folder / ".lock").read_text() == ""  # released


def test_smoke_replaces_only_a_smoke_run(tmp_path, counter_env_registered):
    assert "run.smoke=true" in smoke_overrides("train", {})
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    with pytest.raises(UserError, match="--smoke replaces only a smoke run"):
        RLTrainer(toy_config(tmp_path, "train.steps=1", "run.smoke=true", "run.overwrite=true"),
                  log=lambda _: None).fit()
    assert (tmp_path / "toy" / "checkpoints" / "step_000001").is_dir()
    for _ in range(2):  # a smoke run's folder is started afresh each time
        RLTrainer(toy_config(tmp_path, "train.steps=1", "run.smoke=true", "run.overwrite=true", "run.name=s"),
                  log=lambda _: None).fit()


@pytest.mark.parametrize("planted", ["trainer_state.pt", "learner.pt"])
def test_resume_loads_no_pickle_planted_in_a_checkpoint(tmp_path, counter_env_registered, planted):
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    marker = tmp_path / "ran"
    checkpoint = tmp_path / "toy" / "checkpoints" / "step_000001"
    state = torch.load(checkpoint / planted, weights_only=True)
    torch.save({**state, "extra": Planted(marker)}, checkpoint / planted)
    said: list[str] = []
    with pytest.raises(UserError, match="none of its 1 checkpoints loads"):
        RLTrainer(toy_config(tmp_path, "train.steps=2"), log=said.append).fit(resume=True)
    assert not marker.exists()
    assert any("cannot be loaded" in line for line in said)


def test_a_journal_is_unpickled_only_under_this_users_signature(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "inflight" / "step_000002_round_0.journal"
    journal = Journal(path, key="k")
    journal.save({"tasks": [1]}, {"episodes": [1, 2]})
    assert journal.load({"tasks": [1]}) == {"episodes": [1, 2]}
    forged = {"format": 2, "signature": {"tasks": [1], "key": "k"}, "state": Planted(marker)}
    for data in (pickle.dumps(forged), path.read_bytes()[:-40] + pickle.dumps(forged)[-40:]):
        path.write_bytes(data)
        assert journal.load({"tasks": [1]}) is None and journal.key_on_file() is None
    assert not marker.exists()
    assert not list(tmp_path.rglob("journal.key"))  # the key lives in the cache folder, not beside the journal


def read_only_disk(monkeypatch, under: Path) -> None:
    """Writing a file under `under` fails as on a read-only disk (root ignores chmod)."""
    import builtins
    import errno
    import io

    opened = io.open

    def refuse(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax+") and str(file).startswith(str(under)):
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return opened(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", refuse)
    monkeypatch.setattr(builtins, "open", refuse)


def test_report_and_eval_journal_on_a_read_only_disk_are_one_line(tmp_path, counter_env_registered, monkeypatch):
    RLTrainer(toy_config(tmp_path, "train.steps=1"), log=lambda _: None).fit()
    read_only_disk(monkeypatch, tmp_path)
    reported = run("report", str(tmp_path / "toy"))
    assert reported.returncode == 2 and "cannot write the report" in reported.stderr
    journaled = run("eval", "--policy", "random", "--env", "babyai", "--episodes", "1",
                    "--journal", str(tmp_path / "evals" / "j.journal"))
    assert journaled.returncode == 2 and "cannot be written" in journaled.stderr
    for result in (reported, journaled):
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
