"""End to end through the CLI with a very small model; resume equals continue."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_cli import run

REPO = Path(__file__).resolve().parent.parent
TINY = [
    "model.corpus_episodes=12", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
    "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=320", "warmup.episodes=12", "warmup.epochs=1",
    "algo.tasks_per_step=2", "algo.group_size=3", "algo.minibatch_size=4", "rollout.max_new_tokens=12",
    "schedule.horizons=[2,3]", "schedule.every=2", "train.validation_episodes=2", "train.validate_every=2",
    "train.save_every=2", "optim.micro_batch_size=2",
]


def train(tmp_path: Path, name: str, *extra: str, resume: bool = False):
    args = ["train", str(REPO / "configs" / "babyai_grpo.yaml"), *TINY, f"output_dir={tmp_path}",
            f"run_name={name}", *extra]
    result = run(*args, *(["--resume"] if resume else []))
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / name


def test_train_writes_a_complete_run_folder(tmp_path):
    run_dir = train(tmp_path, "full", "train.steps=4")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/success" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert [r["horizon"] for r in train_rows] == [2, 2, 3, 3]  # ScalingInter-RL stages
    assert [r["step"] for r in rows if "val/success" in r] == [0, 2, 4]
    assert (run_dir / "config.yaml").is_file() and (run_dir / "report" / "training.png").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    assert len(list((run_dir / "trajectories").glob("step_*.jsonl"))) == 4
    assert list((run_dir / "tensorboard").iterdir())
    # A checkpoint is a model folder that eval can load.
    result = run("eval", "--env", "babyai", "--policy", str(run_dir / "checkpoints" / "step_000004" / "model"),
                 "--episodes", "2", "--max-turns", "2")
    assert result.returncode == 0, result.stderr[-2000:]


def test_resume_equals_continue(tmp_path, counter_env_registered):
    """Training 4 steps straight equals training 2, stopping, and resuming for 2 more:
    same weights, same sampled trajectories, same metrics."""
    from agentgym_rl.config import load_train_config
    from agentgym_rl.train.rl import RLTrainer

    def fit(name, steps, resume=False):
        config = load_train_config(REPO / "configs" / "babyai_grpo.yaml", [
            *TINY, "env.id=counter", "env.kwargs={}", f"output_dir={tmp_path}", f"run_name={name}",
            f"train.steps={steps}", "train.validate_every=0", "warmup.episodes=0", "model.corpus_episodes=6"])
        RLTrainer(config, log=lambda _: None).fit(resume=resume)
        return tmp_path / name

    straight = fit("straight", 4)
    fit("halves", 2)
    halves = fit("halves", 4, resume=True)

    def weights(run_dir, step):
        return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")

    a, b = weights(straight, 4), weights(halves, 4)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    for step in (3, 4):
        name = f"trajectories/step_{step:06d}.jsonl"
        assert (straight / name).read_text() == (halves / name).read_text()

    def comparable(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    rows = comparable(straight)
    assert rows == comparable(halves)
    # The resumed steps really trained: an update happened after step 2 and moved the weights.
    assert any(r["update/trajectories"] > 0 for r in rows if r["step"] > 2)
    assert any(not torch.equal(a[k], weights(halves, 2)[k]) for k in a)
