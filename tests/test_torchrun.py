"""`agentgym-rl train` under torchrun with 2 processes (gloo, CPU): rank 0 writes the run once,
every rank trains, the checkpoints load in one process, and a resumed run continues."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_env_e2e import TINY_RUN
from test_server import free_port

from agentgym_rl.agent.loading import load_model_and_tokenizer

REPO = Path(__file__).resolve().parent.parent


def torchrun(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), "-m", "agentgym_rl.cli", "train", str(REPO / "configs" / "babyai_grpo.yaml"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.slow
def test_a_two_process_run_writes_once_and_resumes(tmp_path):
    run = [*TINY_RUN, "env.id=babyai", "algo.tasks_per_step=2", "train.validate_every=10", f"run.output_dir={tmp_path}",
           "run.name=run"]
    result = torchrun(*run, "train.steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]  # one line per step: only rank 0 logs
    assert result.stdout.count("run folder:") == 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Both ranks' episodes reach the advantages: 2 tasks x 2 samples, one task played on each rank,
    # in two groups (each rank's first task is not the same group).
    assert all(row["train/errors"] == 0 and row["adv/num_groups"] == 2 for row in rows[1:])
    assert len((run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000000", "step_000001", "step_000002"]
    model, _ = load_model_and_tokenizer(run_dir / "checkpoints" / "step_000002" / "model")
    assert model.config.hidden_size == 32

    resumed = torchrun(*run, "train.steps=3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3] and "resumed from" in resumed.stdout


def test_too_few_tasks_for_the_ranks_is_a_user_error(tmp_path):
    result = torchrun(*TINY_RUN, "algo.tasks_per_step=1", f"run.output_dir={tmp_path}")
    assert result.returncode != 0
    assert "algo.tasks_per_step=1 gives some of the 2 ranks no task" in result.stderr


@pytest.mark.slow
def test_a_sharded_run_trains_and_its_checkpoint_resumes_in_one_process(tmp_path):
    # An invalid-action penalty gives the tiny, still unskilled policy rewards to learn from.
    run = [*TINY_RUN, "env.id=babyai", "algo.name=ppo", "run.parallel=fsdp", "env.invalid_action_penalty=0.1",
           "train.validate_every=10", f"run.output_dir={tmp_path}", "run.name=run"]
    result = torchrun(*run, "train.steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert all(row["update/trajectories"] > 0 and row["update/grad_norm"] > 0 for row in rows[1:])
    # The checkpoint holds whole tensors (gathered from the shards) and the critic's optimizer state.
    model, _ = load_model_and_tokenizer(run_dir / "checkpoints" / "step_000002" / "model")
    assert model.config.hidden_size == 32
    # One process continues the 2-rank run from its checkpoint (PPO: the value head comes back too).
    one_process = [sys.executable, "-m", "agentgym_rl.cli", "train", str(REPO / "configs" / "babyai_grpo.yaml")]
    resumed = subprocess.run([*one_process, *run, "train.steps=3", "--resume"], capture_output=True, text=True,
                             timeout=600, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    # And 2 ranks continue the 1-process run: the optimizer state is sharded anew.
    again = torchrun(*run, "train.steps=4", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4] and rows[-1]["update/grad_norm"] > 0
