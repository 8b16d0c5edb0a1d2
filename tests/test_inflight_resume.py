"""A training process killed (SIGKILL) in the middle of a rollout, then resumed: the episodes the
step had started are continued from the journal (`rollout.journal_every`), each finishes once and
is trained once, with the tokens of the run that was never stopped; the same for a validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_e2e import REPO, TINY

from agentgym_rl.rollout.trajectory import load_trajectories

# Trains in a process of its own, which SIGKILLs itself at the Nth environment step of RL step
# 2's rollout, or of step 1's validation (steps run in the engine's threads: the whole process
# goes, as with `kill -9`).
SCRIPT = """
import json, os, signal, sys, threading
from agentgym_rl.config import RLConfig, load_config
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.train.rl import RLTrainer

config_path, overrides, kill_at, phase = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
play_step, validate, env_step = RLTrainer._play_step, RLTrainer.validate, RolloutEngine._step
counted, lock = {"on": False, "calls": 0}, threading.Lock()

def playing(self, step, horizon, between_turns=None):
    counted["on"] = phase == "rollout" and step == 1
    return play_step(self, step, horizon, between_turns)

def validating(self, step):
    counted["on"] = phase == "validation" and step == 1
    return validate(self, step)

def dying(self, *args):
    with lock:
        counted["calls"] += counted["on"]
        if counted["calls"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return env_step(self, *args)

RLTrainer._play_step, RLTrainer.validate, RolloutEngine._step = playing, validating, dying
RLTrainer(load_config(RLConfig, config_path, overrides), log=print).fit()
"""

# Step 1 validates its 4 items, which all start at once (as step 0 does, not counted).
VALIDATING = ["train.steps=1", "train.validate_every=1", "eval.episodes=4", "eval.max_turns=4",
              "eval.temperature=1.0"]  # sampled: a resumed episode must draw as the uninterrupted one


def _overrides(tmp_path: Path, name: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [*TINY, "env.id=textcraft", "env.kwargs={}", f"run.output_dir={tmp_path}", f"run.name={name}",
            "train.steps=2", "train.save_every=1", "train.validate_every=0", "rollout.threads=1",
            "rollout.journal_every=1", "schedule.horizons=[4]", "warmup.episodes=0", *extra]


def _train(tmp_path: Path, name: str, resume: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    """In this process, on one thread as the killed process (so the same float rounding); returns
    the lines it logged."""
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train.rl import RLTrainer

    threads, lines = torch.get_num_threads(), []
    torch.set_num_threads(1)
    try:
        config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", _overrides(tmp_path, name, extra))
        RLTrainer(config, log=lines.append).fit(resume=resume)
    finally:
        torch.set_num_threads(threads)
    return lines


def _train_until_killed(tmp_path: Path, name: str, kill_at: int, phase: str = "rollout",
                        extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "configs" / "babyai_grpo.yaml"),
                           json.dumps(_overrides(tmp_path, name, extra)), str(kill_at), phase],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "tests")})


@pytest.mark.slow
def test_sigkill_mid_rollout_then_resume_finishes_every_started_episode_once_as_if_never_stopped(tmp_path):
    _train(tmp_path, "whole")
    straight = tmp_path / "whole"
    second = load_trajectories(straight / "trajectories" / "step_000002.jsonl")
    # Die two environment steps into the second turn of step 2: its first turn is journaled.
    kill_at = len(second) + 2
    killed = _train_until_killed(tmp_path, "killed", kill_at)
    assert killed.returncode == -9, killed.stderr[-3000:]
    run_dir = tmp_path / "killed"
    assert not (run_dir / "checkpoints" / "step_000002").exists()
    assert (run_dir / "inflight" / "step_000002_round_0.journal").is_file()
    assert not (run_dir / "inflight" / "step_000001_round_0.journal").exists()  # step 1's checkpoint holds it

    _train(tmp_path, "killed", resume=True)
    again = load_trajectories(run_dir / "trajectories" / "step_000002.jsonl")
    assert [(t.group, t.item_id) for t in again] == [(t.group, t.item_id) for t in second]  # each once
    assert [t.input_ids for t in again] == [t.input_ids for t in second]
    for a, b in zip(again, second):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # step 2 trained once
    assert rows[1]["rollout/resumed_episodes"] > 0
    # Every episode had begun: the unfinished continued, the finished (none here) read back.
    assert rows[1]["rollout/resumed_episodes"] + rows[1]["rollout/reread_episodes"] == len(second)
    a = load_file(straight / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    b = load_file(run_dir / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert not list((run_dir / "inflight").glob("*.journal"))  # the last checkpoint holds everything


@pytest.mark.slow
def test_a_validation_killed_midway_goes_on_from_its_journal_on_resume(tmp_path):
    _train(tmp_path, "whole", extra=tuple(VALIDATING))
    validated = load_trajectories(tmp_path / "whole" / "validation" / "step_000001.jsonl")
    assert len(validated) == 4 and min(t.turns for t in validated) >= 2
    # Die two environment steps into the validation's second turn: its first turn is journaled.
    killed = _train_until_killed(tmp_path, "killed", len(validated) + 2, "validation", tuple(VALIDATING))
    assert killed.returncode == -9, killed.stderr[-3000:]
    run_dir = tmp_path / "killed"
    assert (run_dir / "checkpoints" / "step_000001").is_dir()  # saved before it validated
    assert (run_dir / "inflight" / "validation_000001.journal").is_file()
    assert not (run_dir / "validation" / "step_000001.jsonl").exists()

    # Due anyway (the last step validates); `validation_missing` below checks a journal alone.
    lines = _train(tmp_path, "killed", resume=True, extra=(*VALIDATING, "train.validate_every=100"))
    assert "step 1: its validation did not finish before the run stopped; going on from its journal" in lines
    assert "step 1: the validation went on from its journal (0 finished episodes kept, 4 unfinished ones " \
           "continued)" in lines
    again = load_trajectories(run_dir / "validation" / "step_000001.jsonl")
    assert [t.item_id for t in again] == [t.item_id for t in validated]
    assert [t.input_ids for t in again] == [t.input_ids for t in validated]
    assert [t.reward for t in again] == [t.reward for t in validated]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    whole = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val/success"] for r in rows if "val/success" in r] == [r["val/success"] for r in whole
                                                                        if "val/success" in r]
    assert not list((run_dir / "inflight").glob("*.journal"))  # the metrics hold the validation now


def test_a_step_is_due_a_validation_every_k_steps_after_the_last_and_where_its_journal_is(tmp_path):
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train.rl import validation_journal, validation_missing

    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml",
                         _overrides(tmp_path, "due", ("train.steps=7", "train.validate_every=3")))
    run_dir = tmp_path / "due"
    run_dir.mkdir()
    assert [step for step in range(9) if validation_missing(run_dir, config, step)] == [3, 6, 7]
    # A validation begun and cut short (a run stopped by train.time_limit_min after step 4) is owed.
    validation_journal(run_dir, 4).parent.mkdir()
    validation_journal(run_dir, 4).write_text("")
    assert [step for step in range(9) if validation_missing(run_dir, config, step)] == [3, 4, 6, 7]
    (run_dir / "metrics.jsonl").write_text('{"step": 3, "val/success": 0.5}\n{"step": 4, "val/success": 0.5}\n')
    assert [step for step in range(9) if validation_missing(run_dir, config, step)] == [6, 7]
    config.train.validate_every = 0  # validation off: nothing is due but what a journal began
    validation_journal(run_dir, 4).unlink()
    assert [step for step in range(9) if validation_missing(run_dir, config, step)] == []


def test_a_journal_needs_checkpoints_to_resume_from(tmp_path):
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train.rl import not_alongside

    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", _overrides(tmp_path, "none"))
    assert not_alongside(config, world=1) is None
    config.train.save_every = 0
    assert not_alongside(config, world=1) == ("rollout.journal_every resumes a step from the run's checkpoints "
                                              "and train.save_every=0 writes none: drop one of the two")


def test_an_eval_cut_short_goes_on_from_its_journal_and_refuses_another_evaluations(tmp_path, tiny_tokenizer,
                                                                                     monkeypatch):
    """`eval --journal`: interrupted, the same command goes on from the journal and ends as the
    evaluation never stopped, sampling included (each episode draws from its own stream); run
    once more it reads every episode back; other settings are refused in one line instead of
    mixing their episodes in."""
    from test_backends import SMALL
    from test_cli import run

    from agentgym_rl.agent.tiny import build_model
    from agentgym_rl.rollout.engine import RolloutEngine

    folder, journal = tmp_path / "model", tmp_path / "eval.journal"
    build_model(tiny_tokenizer, SMALL).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    args = ("eval", "--env", "textcraft", "--policy", str(folder), "--episodes", "3", "--max-turns", "3",
            "--temperature", "1", "rollout.threads=1", "rollout.max_new_tokens=8")
    whole = run(*args, "--trajectories", str(tmp_path / "whole.jsonl"))
    assert whole.returncode == 0, whole.stderr

    step, calls = RolloutEngine._step, {"n": 0}

    def interrupted(self, *rest):
        calls["n"] += 1
        if calls["n"] == 5:  # in the second turn: the first is journaled
            raise KeyboardInterrupt
        return step(self, *rest)

    monkeypatch.setattr(RolloutEngine, "_step", interrupted)
    assert run(*args, "--journal", str(journal)).returncode == 130 and journal.is_file()
    monkeypatch.setattr(RolloutEngine, "_step", step)

    again = run(*args, "--journal", str(journal), "--trajectories", str(tmp_path / "again.jsonl"))
    assert again.returncode == 0, again.stderr
    assert f"went on from the journal {journal}: 0 finished episodes kept, 3 unfinished ones continued" in again.stdout
    first, second = (load_trajectories(tmp_path / f"{name}.jsonl") for name in ("whole", "again"))
    assert [t.input_ids for t in second] == [t.input_ids for t in first]
    assert again.stdout.split("\n")[-8:] == whole.stdout.split("\n")[-8:]  # the same table

    read_back = run(*args, "--journal", str(journal))
    assert "3 finished episodes kept, 0 unfinished ones continued" in read_back.stdout
    other = run(*args[:-4], "--temperature", "0.5", *args[-2:], "--journal", str(journal))
    assert other.returncode == 2
    assert other.stderr.strip() == (f"error: {journal} is the journal of another evaluation (other settings, items "
                                    "or weights); give another --journal or delete it")
