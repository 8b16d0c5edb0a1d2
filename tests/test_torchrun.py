"""`agentgym-rl train` under torchrun with 2 processes (gloo, CPU): rank 0 writes the run once,
every rank trains, the checkpoints load in one process, and a run resumes with another number of
processes and another kind of parallelism (FSDP2 shards, DDP replicas)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import run as in_process
from test_env_e2e import TINY_RUN
from test_server import free_port

from agentgym_rl.agent.loading import load_model_and_tokenizer

REPO = Path(__file__).resolve().parent.parent


def torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), "-m", "agentgym_rl.cli", "train", str(REPO / "configs" / "babyai_grpo.yaml"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


def test_too_few_tasks_for_the_ranks_is_a_user_error(tmp_path):
    result = torchrun(*TINY_RUN, "algo.tasks_per_step=1", f"run.output_dir={tmp_path}")
    assert result.returncode != 0
    assert "algo.tasks_per_step=1 gives some of the 2 ranks no task" in result.stderr


@pytest.mark.slow
def test_two_processes_write_the_run_once_and_it_resumes_across_process_counts_and_sharding(tmp_path):
    # PPO (the value head and its optimizer state travel too); an invalid-action penalty gives the
    # tiny, still unskilled policy rewards to learn from.
    run = [*TINY_RUN, "env.id=babyai", "algo.name=ppo", "env.invalid_action_penalty=0.1", "train.validate_every=10",
           f"run.output_dir={tmp_path}", "run.name=run"]
    run_dir = tmp_path / "run"

    def rows() -> list[dict]:
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    def steps() -> list[dict]:  # the rows of training steps (each invocation validates after its last too)
        return [row for row in rows() if "train/success" in row]

    # 2 ranks, the learner sharded by FSDP2.
    result = torchrun(*run, "run.parallel=fsdp", "train.steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["step"] for row in rows()] == [0, 1, 1]  # one line per step and validation: only rank 0 logs
    assert result.stdout.count("run folder:") == 1
    # Both ranks' episodes reach the update: 2 tasks x 2 samples, one task played on each rank.
    assert all(row["train/errors"] == 0 and row["update/trajectories"] == 4 and row["update/grad_norm"] > 0
               for row in steps())
    assert len((run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000000", "step_000001"]
    # The checkpoint holds whole tensors, gathered from the shards.
    model, _ = load_model_and_tokenizer(run_dir / "checkpoints" / "step_000001" / "model")
    assert model.config.hidden_size == 32

    # One process continues the 2-rank run from its checkpoint (this one: no process to start).
    resumed = in_process("train", str(REPO / "configs" / "babyai_grpo.yaml"), *run, "run.parallel=fsdp",
                         "train.steps=2", "--resume", cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and [row["step"] for row in steps()] == [1, 2]

    # And 2 replicated (DDP) ranks continue the 1-process run: its optimizer state is split anew.
    again = torchrun(*run, "run.parallel=ddp", "train.steps=3", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout and again.stdout.count("run folder:") == 1
    assert [row["step"] for row in steps()] == [1, 2, 3] and steps()[-1]["update/grad_norm"] > 0
    assert [row["step"] for row in rows() if "val/success" in row] == [0, 1, 2, 3]


def test_a_rank_ends_with_its_exit_handlers_run_and_output_flushed():
    script = ("import atexit; atexit.register(lambda: print('handlers ran'))\n"
              "from agentgym_rl.train.distributed import end_rank\n"
              "print('written', end=''); end_rank(3)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3 and result.stdout == "writtenhandlers ran\n"
