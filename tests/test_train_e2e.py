"""End to end through the CLI with a very small model; resume equals continue."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from pathlib import Path

import pytest
import torch
import transformers  # noqa: F401 — imported before the in-process CLI runs, as other tests in a worker do
from safetensors.torch import load_file

from conftest import bench_script
from test_cli import run

from agentgym_rl.rollout.trajectory import load_trajectories

REPO = Path(__file__).resolve().parent.parent
TINY = [
    "model.corpus_episodes=12", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
    "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=320", "warmup.episodes=12", "warmup.epochs=1",
    "algo.tasks_per_step=2", "algo.group_size=3", "algo.minibatch_size=4", "rollout.max_new_tokens=12",
    "schedule.horizons=[2,3]", "schedule.every=2", "eval.episodes=2", "train.validate_every=2",
    "train.save_every=2", "optim.micro_batch_size=2",
]


def toy_config(tmp_path: Path, *overrides: str, env: str = "counter", name: str = "toy",
               recipe: str = "babyai_grpo"):
    """The RL config of the tiny model, no warm-up, on a toy counter game (`counter_env_registered`;
    `counter_any_case` also takes the answer in any case): `recipe` with the TINY settings, then
    `overrides`."""
    from agentgym_rl.config import RLConfig, load_config

    return load_config(RLConfig, REPO / "configs" / f"{recipe}.yaml", [
        *TINY, f"env.id={env}", "env.kwargs={}", f"run.output_dir={tmp_path}", f"run.name={name}",
        "warmup.episodes=0", "model.corpus_episodes=6", *overrides])


def train(tmp_path: Path, name: str, *extra: str, resume: bool = False, config: str = "babyai_grpo.yaml"):
    return train_with_output(tmp_path, name, *extra, resume=resume, config=config)[0]


def train_with_output(tmp_path: Path, name: str, *extra: str, resume: bool = False,
                      config: str = "babyai_grpo.yaml"):
    """(run folder, the finished command) of `agentgym-rl train` with the tiny settings."""
    args = ["train", str(REPO / "configs" / config), *TINY, f"run.output_dir={tmp_path}",
            f"run.name={name}", *extra]
    result = run(*args, *(["--resume"] if resume else []))
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / name, result


@pytest.mark.slow
def test_train_writes_a_complete_run_folder(tmp_path):
    run_dir, result = train_with_output(tmp_path, "full", "train.steps=4", "warmup.thoughts=false")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/success" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    # Captured output (not a terminal): one plain line per step with its figures, no bar.
    step_lines = [line for line in result.stdout.splitlines() if line.startswith("step ") and "horizon" in line]
    assert [line.split()[1] for line in step_lines] == ["1/4", "2/4", "3/4", "4/4"]
    for line, row in zip(step_lines, train_rows):
        assert f"success {row['train/success']:.2f}" in line and f"reward {row['train/reward']:.3f}" in line
        assert "tokens/s" in line and row["time/rollout_tokens_per_s"] > 0
        assert row["time/step_s"] >= row["time/rollout_s"] + row["time/update_s"] > 0
        assert f"± {row['train/reward_std']:.3f}" in line and f"reply {row['train/reply_tokens']:.1f}" in line
        if "update/loss" in row:
            assert f"loss {row['update/loss']:.4g}" in line and "grad_norm" in line
            assert f"lr {row['update/lr']:.2g}" in line and f"entropy {row['update/entropy']:.3f}" in line
    output = result.stdout + result.stderr
    drawn = [match.start() for match in re.finditer(r"\r|\x1b|\d+%\|", output)]  # tqdm draws "NN%|" and \r
    assert not drawn, [output[max(0, at - 200):at + 100] for at in drawn[:3]]
    assert [r["horizon"] for r in train_rows] == [2, 2, 3, 3]  # ScalingInter-RL stages
    assert [r["step"] for r in rows if "val/success" in r] == [0, 2, 4]
    assert (run_dir / "config.yaml").is_file() and (run_dir / "report" / "training.png").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    assert len(list((run_dir / "trajectories").glob("step_*.jsonl"))) == 4
    # Each validation keeps its episodes: per-item results, for paired comparisons of runs.
    for row in (r for r in rows if "val/success" in r):
        validated = load_trajectories(run_dir / "validation" / f"step_{row['step']:06d}.jsonl")
        assert len(validated) == 2 and sum(t.success for t in validated) / 2 == row["val/success"]
    assert list((run_dir / "tensorboard").iterdir())
    # A checkpoint is a model folder that eval can load, and it brings its run's env settings
    # (babyai_grpo.yaml trains without the action list in observations).
    played = run_dir / "played.jsonl"
    result = run("eval", "--policy", str(run_dir / "checkpoints" / "step_000004" / "model"),
                 "--episodes", "2", "--max-turns", "2", "--trajectories", str(played))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "settings of run" in result.stderr and "'list_actions': False" in result.stderr
    assert all("Available actions" not in t.messages[0]["content"] for t in load_trajectories(played))
    # So does the model the run kept after its warm-up.
    result = run("eval", "--policy", str(run_dir / "warmup_model"), "--episodes", "1", "--max-turns", "1")
    assert result.returncode == 0 and "'list_actions': False" in result.stderr, result.stderr[-2000:]
    # A flag overrides the run's setting.
    result = run("eval", "--policy", str(run_dir / "checkpoints" / "step_000004" / "model"), "--episodes", "1",
                 "--max-turns", "1", "--env-arg", "list_actions=true", "--trajectories", str(played))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Available actions" in load_trajectories(played)[0].messages[0]["content"]
    # `eval --run` plays the newest checkpoint with the run's eval section: 2 items, greedy.
    result = run("eval", "--run", str(run_dir), "--json", str(run_dir / "eval.json"))
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run_dir / "eval.json").read_text())
    assert summary["episodes"] == 2 and summary["temperature"] == 0.0
    assert summary["policy"] == str(run_dir / "checkpoints" / "step_000004" / "model")
    # A run folder given as the policy is played as with --run.
    result = run("eval", "--policy", str(run_dir), "--json", str(run_dir / "eval_policy.json"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((run_dir / "eval_policy.json").read_text()) | {"seconds": 0} == summary | {"seconds": 0}


ALGORITHMS = ["ppo", "grpo", "reinforce++", "rloo", "loop", "gigpo"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_on_babyai_through_the_cli(tmp_path, algorithm):
    run_dir = train(tmp_path, algorithm, "train.steps=2", "train.validate_every=0",
                    config=f"babyai_{algorithm}.yaml")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # A barely warmed-up model rarely succeeds, so critic-free groups may carry no signal
    # here; that the update runs and changes the weights is checked on the toy env below.
    assert all(any(k.startswith("adv/") for k in r) for r in rows)
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    if algorithm == "ppo":
        assert all("update/value_loss" in r for r in rows)
        # The critic's values are scored before the advantages, in every step; part of the update's time.
        assert all(0 < r["time/score_s"] < r["time/update_s"] for r in rows)
    if algorithm == "gigpo":  # BabyAI names every state its turns start from
        assert all(r["adv/keyed_turn_frac"] == 1.0 for r in rows)
    if algorithm == "reinforce++":  # KL in the reward, to a frozen copy of the warmed-up model
        assert all(r["kl_coef"] == 0.001 for r in rows)
    assert (run_dir / "checkpoints" / "step_000002" / "model" / "config.json").is_file()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_updates_the_policy(tmp_path, counter_env_registered, algorithm):
    """On the toy env read in any case (`conftest.AnyCaseCounterEnv`), groups of 6 differ in
    reward even for an untrained model (shaped reward; measured: one group of two in each step),
    so every algorithm must update."""
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "train.steps=2", "train.validate_every=0", "algo.group_size=6",
                        env="counter_any_case", recipe=f"babyai_{algorithm}")
    trainer = RLTrainer(config, log=lambda _: None)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    updated = [r for r in rows if r["update/trajectories"] > 0]
    assert updated and all(r["update/skipped_steps"] == 0 for r in updated)
    base = load_file(tmp_path / "toy" / "base_model" / "model.safetensors")
    trained = load_file(tmp_path / "toy" / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert any(not torch.equal(base[k], trained[k]) for k in base)
    if algorithm == "gigpo":  # every turn's state is named (the counter), so turns meet in step groups
        assert all(r["adv/keyed_turn_frac"] == 1.0 for r in rows) and any(r["adv/step_groups"] > 0 for r in rows)


def test_max_kl_skips_updates(tmp_path, counter_env_registered):
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "train.steps=2", "train.validate_every=0", "algo.epochs=3", "algo.minibatch_size=1",
                        "optim.lr=0.05", "algo.max_kl=1e-9", env="counter_any_case")
    RLTrainer(config, log=lambda _: None).fit()
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    # The first minibatch of a step is on-policy (KL 0); the ones after an update are not. (A step
    # whose groups all tied has nothing to update.)
    updated = [r for r in rows if r["update/trajectories"] > 0]
    assert updated and all(r["update/skipped_steps"] > 0 for r in updated)


@pytest.mark.parametrize("algorithm,extra", [
    ("grpo", []),
    ("ppo", ["model.lora_rank=4", "algo.kl_coef=0.01", "algo.kl_control=adaptive", "algo.entropy_coef=0.001"]),
    ("grpo", ["curriculum.kind=success"]),
])
def test_resume_equals_continue(tmp_path, counter_env_registered, algorithm, extra):
    """Training 4 steps straight equals training 2, stopping, and resuming for 2 more:
    same weights, same sampled trajectories, same metrics. The PPO case also restores a
    value head, a LoRA adapter over its base, and an adaptive KL coefficient; the curriculum's
    case the success counts its next draws come from. Generation is
    pinned to one thread: a count chosen by timing would change float rounding with the load."""
    from agentgym_rl.train.rl import RLTrainer

    def fit(name, steps, resume=False):
        config = toy_config(tmp_path, f"train.steps={steps}", "train.validate_every=0", f"algo.name={algorithm}",
                            "rollout.threads=1", *extra, name=name)
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


def timed_clock(monkeypatch, step_min: float, validation_min: float = 0.0) -> list[float]:
    """Replace the trainer's clock with one that only a played step (`step_min` minutes, whatever
    its horizon) and a validation (`validation_min`) move on; returns its reading, in seconds."""
    from agentgym_rl.train import rl

    now = [0.0]
    monkeypatch.setattr(rl, "_clock", lambda: now[0])
    play, record = rl.RLTrainer._play_step, rl.RLTrainer._record_validation

    def played(self, *args, **kwargs):
        now[0] += 60 * step_min
        return play(self, *args, **kwargs)

    def recorded(self, *args, **kwargs):  # inside `validate`, which times itself
        now[0] += 60 * validation_min
        return record(self, *args, **kwargs)

    monkeypatch.setattr(rl.RLTrainer, "_play_step", played)
    monkeypatch.setattr(rl.RLTrainer, "_record_validation", recorded)
    return now


def test_a_time_limit_kept_within_stops_early_enough_for_the_last_validation(tmp_path, counter_env_registered,
                                                                             monkeypatch):
    """`train.time_limit_mode=within` stops after the step after which one more step, the last
    validation and the save would end past the limit, as last timed. Steps take 1 minute and
    validations 2: after the step-0 validation, step k ends at 2 + k minutes; with a 10-minute
    limit, 2 + 5 + 1 + 2 = 10 does not pass it and 2 + 6 + 1 + 2 = 11 does, so the run stops after
    step 6 and ends, validated, at 10 minutes, where `after` stops after step 8 and ends at 12."""
    from agentgym_rl.train.rl import RLTrainer

    def fit(name, mode):
        now = timed_clock(monkeypatch, step_min=1.0, validation_min=2.0)
        config = toy_config(tmp_path, "train.steps=12", "train.validate_every=12", "train.save_every=12",
                            "train.time_limit_min=10", f"train.time_limit_mode={mode}", "algo.group_size=2",
                            "algo.tasks_per_step=2", "rollout.threads=1", env="counter_any_case", name=name)
        lines = []
        validations = RLTrainer(config, log=lines.append).fit()
        return [v.step for v in validations], now[0] / 60, lines

    steps, minutes, lines = fit("within", "within")
    assert (steps, minutes) == ([0, 6], 10.0)
    assert "stopped after step 6 of 12: another step would end past train.time_limit_min=10 (time_limit_mode: " \
           "within) (10.0 min); `agentgym-rl train CONFIG --resume` (the same run.name) goes on from it" in lines
    steps, minutes, _ = fit("after", "after")
    assert (steps, minutes) == ([0, 8], 12.0)


def test_the_time_a_run_needs_to_finish_is_one_step_scaled_by_its_horizon_a_validation_and_a_save():
    from agentgym_rl.train.rl import ends_past_limit

    # 420 s in, the last step 60 s at horizon 6, the next at horizon 8: 420 + 80 + 30 + 5 = 535.
    assert not ends_past_limit(420, 540, 60, 6, 8, validation_s=30, save_s=5)
    assert ends_past_limit(430, 540, 60, 6, 8, validation_s=30, save_s=5)  # 545
    assert ends_past_limit(430, 540, 60, 6, 6, validation_s=30, save_s=5) is False  # 525: the same horizon


def test_a_time_limit_ends_the_run_after_a_step_that_validates_and_saves(tmp_path, counter_env_registered,
                                                                         monkeypatch):
    """`train.time_limit_min` stops after the first step that ends past it, counted from the
    start of training, as a last step: that step validates and saves, and `--resume` without the
    limit goes on to what a run without it reaches, weights and metrics alike. On the test's
    clock a step takes a minute and nothing else takes time, so a 1.5-minute limit stops after
    step 2 (and never, were it counted from the start of each step). Each invocation ends on a
    line pairing the run's first validation with its last."""
    from agentgym_rl.eval.metrics import change_sentence
    from agentgym_rl.train.rl import RLTrainer

    def fit(name, *extra, resume=False):
        config = toy_config(tmp_path, "train.steps=4", "train.validate_every=4", "train.save_every=4",
                            "algo.group_size=6", "rollout.threads=1", *extra, env="counter_any_case", name=name)
        lines = []
        validations = RLTrainer(config, log=lines.append).fit(resume=resume)
        return tmp_path / name, lines, validations

    straight, _, _ = fit("straight")
    timed_clock(monkeypatch, step_min=1.0)
    timed, lines, validations = fit("timed", "train.time_limit_min=1.5")
    assert sorted(p.name for p in (timed / "checkpoints").iterdir()) == ["step_000002"]
    assert [v.step for v in validations] == [0, 2]
    assert "stopped after step 2 of 4: train.time_limit_min=1.5 reached (2.0 min); `agentgym-rl train CONFIG " \
           "--resume` (the same run.name) goes on from it" in lines
    assert lines[-2] == "all 2 steps updated the policy" or lines[-2].endswith("of 2 steps updated nothing")
    first, last = validations
    assert lines[-1] == (
        f"validation success, step 0 → 2: {100 * first.summary.success:.1f}% → {100 * last.summary.success:.1f}%, "
        f"{change_sentence(first.item_success, last.item_success)}")
    _, lines, resumed = fit("timed", resume=True)
    # The resumed run validates at its end only; its line pairs that with step 0's, from validation/.
    assert [v.step for v in resumed] == [4] and lines[-1] == (
        f"validation success, step 0 → 4: {100 * first.summary.success:.1f}% → {100 * resumed[0].summary.success:.1f}%, "
        f"{change_sentence(first.item_success, resumed[0].item_success)}")

    def rows(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if "train/success" in r]

    assert [r["step"] for r in rows(timed)] == [1, 2, 3, 4] and rows(timed) == rows(straight)
    assert any(r["update/trajectories"] > 0 for r in rows(straight) if r["step"] > 2)
    a = load_file(straight / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    b = load_file(timed / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_a_run_without_checkpoints_says_it_cannot_be_resumed(tmp_path, counter_env_registered, monkeypatch):
    """`train.save_every=0` writes no checkpoint, even at a time limit, whose line then does not
    offer `--resume`; a `--resume` says why it has nothing to go on from."""
    from agentgym_rl.errors import UserError
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "train.steps=3", "train.validate_every=0", "train.save_every=0",
                        "train.time_limit_min=1.5", "algo.group_size=6", "rollout.threads=1", env="counter_any_case",
                        name="none")
    timed_clock(monkeypatch, step_min=1.0)
    lines = []
    RLTrainer(config, log=lines.append).fit()
    assert "stopped after step 2 of 3: train.time_limit_min=1.5 reached (2.0 min); it wrote no checkpoint to " \
           "go on from (train.save_every=0)" in lines
    assert not (tmp_path / "none" / "checkpoints").exists()
    with pytest.raises(UserError, match=r"it has no checkpoint yet \(train.save_every=0 writes none\)"):
        RLTrainer(config, log=lines.append).fit(resume=True)


def test_a_step_saves_before_it_validates(tmp_path, counter_env_registered, monkeypatch):
    """A step that saves does so before its validation: a validation cut short (SmolLM2's takes
    40 minutes or more on a CPU) leaves the step's checkpoint to evaluate or go on from, and the
    resumed run plays that validation before anything else (`compare` sees it as unfinished)."""
    from agentgym_rl.runs import validated_steps
    from agentgym_rl.train.compare import run_state
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "train.steps=1", "train.validate_every=1", "train.save_every=1",
                        "algo.group_size=6", "rollout.threads=1", env="counter_any_case", name="cut")
    assert run_state(config) == "afresh"
    trainer = RLTrainer(config, log=lambda line: None)
    played = trainer.validate

    def validate(step):
        if step == 1:
            raise KeyboardInterrupt  # the validation after step 1, interrupted
        return played(step)

    monkeypatch.setattr(trainer, "validate", validate)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert [p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()] == ["step_000001"]
    assert validated_steps(tmp_path / "cut") == {0} and run_state(config) == "resume"
    lines = []
    config.train.baseline = str(tmp_path / "step0.jsonl")  # stands only for step 0: said, and not read
    validations = RLTrainer(config, log=lines.append).fit(resume=True)
    assert "step 1: its metrics hold no validation of it; validating now" in lines
    assert "note: train.baseline is not used: the run resumes after step 0" in lines
    assert not any("updated the policy" in line for line in lines), lines  # it trained no step
    assert [v.step for v in validations] == [1]
    assert validated_steps(tmp_path / "cut") == {0, 1} and run_state(config) == "complete"


def test_a_baseline_file_stands_in_for_step_0_once_its_first_turns_replay(tmp_path, counter_env_registered):
    """`train.baseline`: a run given an earlier run's step-0 validation takes it (the same
    episodes, logged as step 0, the closing line paired with it) after replaying the first turn
    of each item; a file whose first reply of one item was another is refused, and so is a
    sampled validation."""
    from agentgym_rl.train.rl import RLTrainer

    def fit(name, *extra):
        config = toy_config(tmp_path, "train.steps=1", "train.validate_every=1", "eval.episodes=3",
                            "rollout.threads=1", *extra, name=name)
        lines = []
        validations = RLTrainer(config, log=lines.append).fit()
        return tmp_path / name, lines, validations

    played, _, validations = fit("played")
    step0 = played / "validation" / "step_000000.jsonl"
    taken, lines, taken_validations = fit("taken", f"train.baseline={step0}")
    assert (taken / "validation" / "step_000000.jsonl").read_text() == step0.read_text()
    assert f"step 0: validation taken from {step0} (the first turn of all 3 items replayed identically)" in lines
    assert [v.step for v in taken_validations] == [0, 1]
    assert taken_validations[0].item_success == validations[0].item_success
    assert lines[-1].startswith("validation success, step 0 → 1")

    def val_rows(run_dir):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "val/success" in r]

    assert val_rows(taken)[0] == val_rows(played)[0]
    # The same file with one token of one item's first reply changed.
    records = [json.loads(line) for line in step0.read_text().splitlines()]
    first_generated = records[1]["loss_mask"].index(1)
    records[1]["input_ids"][first_generated] += 1
    altered = tmp_path / "altered.jsonl"
    altered.write_text("".join(json.dumps(r) + "\n" for r in records))
    from agentgym_rl.errors import UserError

    with pytest.raises(UserError, match="the first turn of 1 of 3 items differs"):
        fit("refused", f"train.baseline={altered}")
    with pytest.raises(UserError, match="reuses a greedy validation"):
        fit("sampled", f"train.baseline={step0}", "eval.temperature=1.0")
    # A run with another turn limit plays the same first turns, and its file would have been taken.
    fit("short", "eval.max_turns=1")
    with pytest.raises(UserError, match=r"settings other than this run's.*: eval\.max_turns \(1 -> \d+\)"):
        fit("longer", f"train.baseline={tmp_path / 'short' / 'validation' / 'step_000000.jsonl'}")


def test_a_baseline_kept_outside_its_run_is_checked_by_the_settings_beside_it(tmp_path, counter_env_registered):
    """A step-0 file copied out of its run folder (bench/keep_baseline.py) carries the settings
    that change later turns in a file beside it: a run with other env kwargs is refused; the
    same file without its settings is taken, and the log says they were taken on trust."""
    import gzip

    from agentgym_rl.errors import UserError
    from agentgym_rl.train.baseline import settings_path
    from agentgym_rl.train.rl import RLTrainer

    def fit(name, *extra):
        config = toy_config(tmp_path, "train.steps=1", "train.validate_every=1", "eval.episodes=2",
                            "rollout.threads=1", *extra, name=name)
        lines = []
        RLTrainer(config, log=lines.append).fit()
        return lines

    fit("played")
    kept = tmp_path / "kept" / "played_step0.jsonl.gz"
    kept.parent.mkdir()
    assert bench_script("keep_baseline").main([str(tmp_path / "played"), str(kept)]) == 0
    step0 = tmp_path / "played" / "validation" / "step_000000.jsonl"
    assert gzip.decompress(kept.read_bytes()).decode() == step0.read_text()
    settings = json.loads(settings_path(kept).read_text())
    assert settings_path(kept).name == "played_step0.settings.json"
    assert settings["env"]["kwargs"] == {} and settings["eval"]["max_turns"] > 0  # the env's limit, made explicit

    lines = fit("taken", f"train.baseline={kept}")
    assert not any("taken on trust" in line for line in lines)
    assert any(line.startswith("step 0: validation taken from") for line in lines)
    settings["env"]["kwargs"] = {"note_unchanged": True}  # as if played with another option of the env
    settings_path(kept).write_text(json.dumps(settings))
    with pytest.raises(UserError, match=r"settings other than this run's.*: env\.kwargs \(\{'note_unchanged': True\} -> \{\}\)"):
        fit("other_kwargs", f"train.baseline={kept}")
    settings_path(kept).unlink()
    lines = fit("trusted", f"train.baseline={kept}")
    assert any("has no played_step0.settings.json beside it" in line and "env.kwargs" in line for line in lines)
    assert any(line.startswith("step 0: validation taken from") for line in lines)


@pytest.mark.parametrize("skip,entropy,expected", [(True, 0.0, 2), (False, 0.0, 4), (True, 0.01, 4)])
def test_skip_zero_advantage_decides_which_rows_are_trained(tmp_path, counter_env_registered, skip, entropy,
                                                            expected):
    """Two GRPO groups of two: rewards (1, 0) give advantages ±1, rewards (0.5, 0.5) give 0.
    Without a KL, value or entropy term the second group is skipped unless
    skip_zero_advantage=false (an entropy bonus reads every row)."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "algo.kl_coef=0", f"algo.skip_zero_advantage={skip}", f"algo.entropy_coef={entropy}")
    trainer = RLTrainer(config, log=lambda _: None)
    trainer._setup(resume=False)
    rows = [Trajectory("counter", "counter_1", "goal1", group=group, input_ids=[5, 6, 7, 8],
                       loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -1.0, -1.0], turn_rewards=[reward])
            for group, reward in [(0, 1.0), (0, 0.0), (1, 0.5), (1, 0.5)]]
    metrics = trainer.update(rows, step=0)
    assert metrics["update/trajectories"] == expected


# Group 0's advantages are ±a (WON_ADVANTAGE), a = 0.5 / std(1, 0) = 0.5 / 0.7071 (GRPO's sample std); the
# mean |advantage| over the 16 trained tokens: null 8a/16, 0.0 6a/16 (the won row's first
# turn drops to 0), 0.5 (6a + 4 x 0.5)/16 (each row's wrong or idle token a further -0.5).
WON_ADVANTAGE = 0.5 / 0.5 ** 0.5


def toy_rows(rows):
    """The toy batch: (group, reward, fields) → a two-turn counter episode, replies at positions
    1–2 and 5–6, the reward on its last turn, with the given `Trajectory` fields."""
    from agentgym_rl.rollout.trajectory import Trajectory

    return [Trajectory("counter", "counter_1", "goal1", group=group, input_ids=[5, 6, 7, 8, 9, 10, 11],
                       loss_mask=[0, 1, 1, 0, 0, 1, 1], logprobs=[0.0, -1.0, -1.0, 0.0, 0.0, -1.0, -1.0],
                       turn_rewards=[0.0, reward], **fields) for group, reward, fields in rows]


def toy_update(tmp_path, rows, *settings: str):
    """One update of the toy config with `algo.kl_coef=0` and `settings` on `toy_rows(rows)`:
    (whether the engine locates actions, the update's metrics, the (B, T) advantages of each
    batch `_optimize` was handed)."""
    from agentgym_rl.train.rl import RLTrainer

    trainer = RLTrainer(toy_config(tmp_path, "algo.kl_coef=0", *settings), log=lambda _: None)
    trainer._setup(resume=False)
    optimize, seen = trainer._optimize, []
    trainer._optimize = lambda batch, *args: seen.append(batch.advantages.clone()) or optimize(batch, *args)
    return trainer.engine.config.locate_wrong_tokens, trainer.update(toy_rows(rows), step=0), seen


@pytest.mark.parametrize("kind", ["invalid", "idle"])
@pytest.mark.parametrize("penalty,capped,trained,token_abs", [
    ("null", None, 2, 8 * WON_ADVANTAGE / 16), (0.0, 2, 2, 6 * WON_ADVANTAGE / 16),
    (0.5, 2, 4, (6 * WON_ADVANTAGE + 2) / 16)])
def test_a_turn_that_cannot_have_helped_loses_its_credit(tmp_path, counter_env_registered, kind, penalty, capped,
                                                         trained, token_abs):
    """Group 0: a won and a lost episode whose first of two turns was rejected (invalid) or
    accepted but left the state as it was (idle), wrong or its action beginning at its first
    token (position 1). Group 1: two such lost episodes (a tie: A = 0). With a penalty of 0 the
    won episode's first turn (2 tokens) loses its positive advantage; with 0.5 every such token
    is pushed down, so the tied group is trained on too, and the advantages the loss sees are
    not the estimator's (`adv/token_abs_mean`)."""
    first_turn = ({"invalid_turns": [0], "wrong_tokens": [1]} if kind == "invalid"
                  else {"state_keys": ["0", "0"], "idle_turns": [0], "idle_tokens": [1]})
    located, metrics, _ = toy_update(tmp_path, [(0, 1.0, first_turn), (0, 0.0, first_turn), (1, 0.0, first_turn),
                                                (1, 0.0, first_turn)], f"algo.{kind}_turn_penalty={penalty}")
    assert located == (penalty != "null")
    assert metrics.get(f"adv/{kind}_tokens_capped") == capped
    assert metrics.get("adv/wrong_tokens" if kind == "invalid" else "adv/idle_tokens") == (
        None if penalty == "null" else 4)
    assert metrics["update/trajectories"] == trained
    assert metrics["adv/token_abs_mean"] == pytest.approx(token_abs, rel=1e-4)
    assert metrics["adv/adv_abs_mean"] == pytest.approx(2 * WON_ADVANTAGE / 4, rel=1e-4)  # the estimator's, per row


@pytest.mark.parametrize("bonus", ["null", 0.5])
def test_a_rare_action_earns_its_bonus_at_its_first_token(tmp_path, counter_env_registered, bonus):
    """The toy batch above, each turn's action located at its first token (positions 1 and 5):
    7 "go" and one "pickup" (row 2, second turn). At share 0.25 (2 of 8 actions) "pickup" is
    rare: its token gets +0.5, so its tied group's row is trained on too, and the mean
    |advantage| the loss sees grows by 0.5 over the 16 trained tokens."""
    located, metrics, seen = toy_update(
        tmp_path, [(group, reward, {"action_tokens": [1, 5], "action_verbs": ["go", second]})
                   for group, reward, second in [(0, 1.0, "go"), (0, 0.0, "go"), (1, 0.0, "pickup"), (1, 0.0, "go")]],
        f"algo.rare_action_bonus={bonus}", "algo.rare_action_share=0.25")
    assert located == (bonus != "null")
    if bonus == "null":
        assert "adv/rare_action_tokens" not in metrics and metrics["update/trajectories"] == 2
        assert metrics["adv/token_abs_mean"] == pytest.approx(8 * WON_ADVANTAGE / 16, rel=1e-4)
        return
    assert (metrics["adv/action_tokens"], metrics["adv/rare_action_tokens"], metrics["adv/rare_verbs"]) == (8, 1, 1)
    assert metrics["update/trajectories"] == 3
    assert metrics["adv/token_abs_mean"] == pytest.approx((8 * WON_ADVANTAGE + 0.5) / 16, rel=1e-4)
    assert seen[0][2].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]  # the kept tied row: "pickup" raised


@pytest.mark.parametrize("bonus", ["null", 0.5])
def test_an_action_that_discovered_something_earns_its_bonus_at_its_first_token(tmp_path, counter_env_registered,
                                                                                 monkeypatch, bonus):
    """The toy batch above, with one action that showed something unseen: the tied group's row
    2, second turn (position 5). Its token gets +0.5 and nothing else changes, so that row is
    trained on too and the mean |advantage| the loss sees grows by 0.5 over the 16 trained tokens."""
    from agentgym_rl.envs import registry

    monkeypatch.setitem(registry._REGISTRY, "counter", dataclasses.replace(registry.spec("counter"), discoveries=True))
    located, metrics, seen = toy_update(
        tmp_path, [(group, reward, {"action_tokens": [1, 5], "action_verbs": ["go", "go"], "discovery_tokens": found})
                   for group, reward, found in [(0, 1.0, []), (0, 0.0, []), (1, 0.0, [5]), (1, 0.0, [])]],
        f"algo.discovery_bonus={bonus}")
    assert located == (bonus != "null")
    if bonus == "null":
        assert "adv/discovery_tokens" not in metrics and metrics["update/trajectories"] == 2
        assert metrics["adv/token_abs_mean"] == pytest.approx(8 * WON_ADVANTAGE / 16, rel=1e-4)
        return
    assert metrics["adv/discovery_tokens"] == 1 and metrics["update/trajectories"] == 3
    assert metrics["adv/token_abs_mean"] == pytest.approx((8 * WON_ADVANTAGE + 0.5) / 16, rel=1e-4)
    assert seen[0][2].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]


def test_algo_clip_eps_high_reaches_the_policy_loss(tmp_path, counter_env_registered, monkeypatch):
    """The trainer hands the policy loss the recipe's settings with the run's overrides
    (`algos.rl_objective`, by its keywords): clip-higher set in the config arrives as ε_high."""
    from agentgym_rl.algos import LOSS
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import RLTrainer

    received = []
    ppo_clip = LOSS["ppo_clip"]

    @functools.wraps(ppo_clip)  # the same signature: the settings are picked by its keywords
    def recording(*args, **kwargs):
        received.append(kwargs)
        return ppo_clip(*args, **kwargs)

    monkeypatch.setitem(LOSS, "ppo_clip", recording)
    config = toy_config(tmp_path, "algo.kl_coef=0", "algo.clip_eps_high=0.28")
    trainer = RLTrainer(config, log=lambda _: None)
    trainer._setup(resume=False)
    rows = [Trajectory("counter", "counter_1", "goal1", group=0, input_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1],
                       logprobs=[0.0, 0.0, -1.0, -1.0], turn_rewards=[reward]) for reward in (1.0, 0.0)]
    assert trainer.update(rows, step=0)["update/trajectories"] == 2
    assert received and all((kwargs["clip_eps"], kwargs["clip_eps_high"]) == (0.2, 0.28) for kwargs in received)


@pytest.mark.parametrize("cap,loss", [(None, 0.0), (1.5, -WON_ADVANTAGE / 4)])
def test_truncated_importance_sampling_reweights_a_generator_that_differs(tmp_path, counter_env_registered,
                                                                         cap, loss):
    """A won (A = +a) and a lost (A = −a) episode of one group, two trained tokens each. The
    won one's generator logprobs are the learner's minus ln 2 (a generator that found its
    tokens half as likely): with algo.tis_cap 1.5 its weight is min(2, 1.5) = 1.5, the lost
    one's 1, so the first loss (ratios 1) is (2·(−a)·1.5 + 2·a·1)/4 = −a/4; without TIS the
    two cancel to 0. Weights taken the wrong way round (π_gen/π_old) would give +a/4."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.batch import collate
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "algo.kl_coef=0", f"algo.tis_cap={cap or 'null'}")
    trainer = RLTrainer(config, log=lambda _: None)
    trainer._setup(resume=False)
    rows = [Trajectory("counter", "counter_1", "goal1", group=0, input_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1],
                       logprobs=[0.0] * 4, turn_rewards=[reward]) for reward in (1.0, 0.0)]
    learner = trainer.learner.outputs(collate(rows, trainer.tokenizer.pad_token_id)).logprobs
    for row, shift in zip(rows, (math.log(2), 0.0)):
        row.logprobs = [0.0, 0.0] + [float(lp) - shift for lp in learner[rows.index(row), 2:4]]
    metrics = trainer.update(rows, step=0)
    assert metrics["update/loss"] == pytest.approx(loss, abs=1e-4)
    if cap is not None:
        assert metrics["update/tis_weight_mean"] == pytest.approx(1.25, abs=1e-4)
        assert metrics["update/tis_capped_fraction"] == pytest.approx(0.5)
    else:
        assert "update/tis_weight_mean" not in metrics


def test_groups_with_a_reward_spread():
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import groups_with_reward_spread

    def row(group, reward, error=None):
        return Trajectory("counter", "counter_1", "goal1", group=group, turn_rewards=[reward], error=error)

    # Group 0 ties; 1 differs; 2 differs only through an episode cut short by an error (left out).
    rows = [row(0, 0.5), row(0, 0.5), row(1, 1.0), row(1, 0.0), row(2, 0.0), row(2, 1.0, error="crash")]
    assert groups_with_reward_spread(rows) == {1}


def test_dapos_filter_fills_the_places_left_with_fallback_groups_in_order():
    """Groups 1 and 3 differ, 0, 2 and 4 tie. Four places: 1 and 3, then the tied fallback
    groups 2 and 4 (0 is not one); two places: 1 and 3 only; three: 1, 3 and the first fallback."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import dapo_filter

    rows = [Trajectory("counter", "counter_1", "goal1", group=group, turn_rewards=[reward])
            for group in range(5) for reward in ((1.0, 0.0) if group % 2 else (0.0, 0.0))]
    kept, dropped = dapo_filter(rows, 4, fallback={4, 2, 3})
    assert sorted({t.group for t in kept}) == [1, 2, 3, 4] and dropped == 1
    kept, dropped = dapo_filter(rows, 2, fallback={2, 4})
    assert sorted({t.group for t in kept}) == [1, 3] and dropped == 3
    kept, dropped = dapo_filter(rows, 3, fallback={4, 2})  # the first in order
    assert sorted({t.group for t in kept}) == [1, 2, 3] and dropped == 2
    assert dapo_filter(rows, 3, fallback={7})[1] == 3  # group 7 was never played: it takes no place
    assert dapo_filter(rows, 4)[1] == 3  # no fallback: the tied groups all dropped


@pytest.mark.parametrize("rounds", [0, 3])
def test_dynamic_sampling_refills_groups_whose_rewards_tie(tmp_path, counter_env_registered, rounds):
    """A scripted policy: the two samples of an even task tie, an odd task's differ. With
    algo.dynamic_sampling 3, tied groups are replaced by new tasks until 4 groups have a
    spread, each refill drawn as a pure function of (seed, step, round); with 0, none are."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import RLTrainer, groups_with_reward_spread

    config = toy_config(tmp_path, "algo.tasks_per_step=4", "algo.group_size=2", f"algo.dynamic_sampling={rounds}")
    trainer = RLTrainer(config, log=lambda _: None)
    calls = []

    seeds = []

    def scripted(tasks, horizon, sampling_seed, journal=None, between_turns=None):
        calls.append([task.index for task in tasks])
        seeds.append(sampling_seed)
        return [Trajectory("counter", task.item_id, task.category, group=group, turn_rewards=[reward])
                for group, task in enumerate(tasks) for reward in ((0.0, 0.0) if task.index % 2 == 0 else (1.0, 0.0))]

    trainer._play = scripted
    trajectories, metrics = trainer._play_step(step=5, horizon=3)
    first = calls[0]
    assert first == [task.index for task in trainer.sample_tasks(5)]
    ties = sum(index % 2 == 0 for index in first)
    assert 0 < ties < 4  # seed 0 draws both kinds at step 5: the test needs a refill to happen
    spread = groups_with_reward_spread(trajectories)
    if rounds == 0:
        assert len(calls) == 1 and metrics == {} and len(spread) == 4 - ties
        return
    played = [index for call in calls for index in call]
    assert len(spread) == 4 and len(set(played)) == len(played)  # no task played twice in a step
    assert sorted({t.group for t in trajectories}) == list(range(len(played)))
    assert metrics == {"sampling/refill_rounds": len(calls) - 1, "sampling/extra_groups": len(played) - 4,
                       "sampling/groups_with_signal": 4}
    # The refills are a pure function of the step: a second trainer draws the same.
    again = RLTrainer(config, log=lambda _: None)
    again._play, calls_before, seeds_before = scripted, list(calls), list(seeds)
    again._play_step(step=5, horizon=3)
    assert calls[len(calls_before):] == calls_before
    # ... and so are the sampling streams, one seed per refill round.
    assert seeds[len(seeds_before):] == seeds_before and len(set(seeds_before)) == len(seeds_before)


def test_dapo_filter_keeps_the_first_groups_with_a_reward_spread_by_hand():
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import dapo_filter

    def row(group, reward, error=None):
        return Trajectory("e", f"e_{group}", "c", group=group, turn_rewards=[reward], error=error)

    rows = [row(0, 0.0), row(0, 0.0),                     # tied: dropped
            row(1, 1.0), row(1, 0.0),                     # kept
            row(2, 0.0), row(2, 1.0, error="crash"),      # its spread is an error's: tied, dropped
            row(3, 0.5), row(3, 0.0),                     # kept
            row(4, 1.0), row(4, 0.0)]                     # a spread beyond 2 groups: dropped
    kept, dropped = dapo_filter(rows, groups=2)
    assert [(t.group, t.reward) for t in kept] == [(1, 1.0), (1, 0.0), (3, 0.5), (3, 0.0)] and dropped == 3
    assert dapo_filter(rows, groups=5)[1] == 2  # fewer groups with a signal than asked: the batch is smaller


@pytest.mark.parametrize("filtered", [False, True])
def test_the_dapo_filter_trains_on_tasks_per_step_groups_with_a_signal(tmp_path, counter_env_registered, filtered):
    """Refills played until 4 groups have a reward spread: with algo.dynamic_sampling_filter the
    update trains on exactly those 4 groups (the tied ones dropped, counted); without it, on every
    group played (the KL term keeps the tied rows), as RESULTS' runs did."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "algo.tasks_per_step=4", "algo.group_size=2", "algo.dynamic_sampling=3",
                        "algo.kl_coef=0.001", f"algo.dynamic_sampling_filter={str(filtered).lower()}",
                        name=f"dapo_{filtered}")
    trainer = RLTrainer(config, log=lambda _: None)
    trainer._setup(resume=False)

    def scripted(tasks, horizon, sampling_seed, journal=None, between_turns=None):
        return [Trajectory("counter", task.item_id, task.category, group=group, turn_rewards=[reward],
                           input_ids=[5, 6, 7, 8], loss_mask=[0, 1, 1, 1], logprobs=[0.0, -1.0, -1.0, -1.0])
                for group, task in enumerate(tasks) for reward in ((0.0, 0.0) if task.index % 2 == 0 else (1.0, 0.0))]

    trainer._play = scripted
    trajectories, _ = trainer._play_step(step=5, horizon=3)
    played = len({t.group for t in trajectories})
    assert played > 4  # some groups tied and were refilled
    trained, metrics = trainer._trained(trajectories)
    updated = trainer.update(trained, 5)
    if filtered:
        assert metrics == {"sampling/groups_dropped": played - 4} and updated["update/trajectories"] == 8
    else:
        assert metrics == {} and updated["update/trajectories"] == 2 * played
    # Through the loop: the step's line in metrics.jsonl counts the groups dropped.
    again = RLTrainer(toy_config(tmp_path, "algo.tasks_per_step=4", "algo.group_size=2", "algo.dynamic_sampling=3",
                                 "algo.kl_coef=0.001", f"algo.dynamic_sampling_filter={str(filtered).lower()}",
                                 "train.steps=1", "train.validate_every=0", name=f"dapo_fit_{filtered}"),
                      log=lambda _: None)
    again._play = scripted
    again.fit()
    row = next(json.loads(line) for line in (tmp_path / f"dapo_fit_{filtered}" / "metrics.jsonl").read_text()
               .splitlines() if "train/success" in line)
    assert ("sampling/groups_dropped" in row) == filtered


@pytest.mark.parametrize("keeps_rare", [False, True])
def test_the_dapo_filter_keeps_tied_groups_with_a_rare_action_when_asked(tmp_path, counter_env_registered,
                                                                         keeps_rare):
    """Five groups of 2 for 3 places. Group 0's rewards differ ("go", "pickup"); group 1 ties
    ("pickup", "go"); groups 2 and 3 tie on "go"; group 4 has a "go" and an episode cut short by
    an error with three "pickup" (left out of every count, or "pickup" would not be rare). Over
    the 9 actions the update can train on, "pickup" (2) is rare at share 0.25; over the 4 of
    groups 0 and 1 it is not. By default the filter keeps group 0 alone and counts over it: no
    bonus. With filter_keeps_rare_actions group 1 fills a place left (the one tied group kept
    for its "pickup"), both "pickup" tokens earn the bonus, and 3 rows are trained (group 1's
    "go" row has no signal)."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import RLTrainer

    def episode(group, reward, verbs, error=None):
        return Trajectory("counter", f"counter_{group}", "goal1", group=group, input_ids=[5, 6, 7, 8],
                          loss_mask=[0, 1, 1, 1], logprobs=[0.0, -1.0, -1.0, -1.0], turn_rewards=[reward],
                          action_tokens=[1, 2, 3][:len(verbs)], action_verbs=verbs, error=error)

    rows = [episode(group, reward, [verb]) for group, reward, verb in
            [(0, 1.0, "go"), (0, 0.0, "pickup"), (1, 0.0, "pickup"), (1, 0.0, "go"), (2, 0.0, "go"),
             (2, 0.0, "go"), (3, 0.0, "go"), (3, 0.0, "go"), (4, 0.0, "go")]]
    rows.append(episode(4, 0.0, ["pickup"] * 3, error="the environment crashed"))
    settings = ["algo.group_size=2", "algo.kl_coef=0", "algo.dynamic_sampling_filter=true",
                "algo.rare_action_bonus=0.5", f"algo.filter_keeps_rare_actions={str(keeps_rare).lower()}"]
    trainer = RLTrainer(toy_config(tmp_path, "algo.tasks_per_step=3", "algo.rare_action_share=0.25", *settings),
                        log=lambda _: None)
    trainer._setup(resume=False)
    trained, metrics = trainer._trained(rows)
    optimize, seen = trainer._optimize, []
    trainer._optimize = lambda batch, *args: seen.append(batch.advantages.clone()) or optimize(batch, *args)
    updated = trainer.update(trained, 0, rows if keeps_rare else None)
    if keeps_rare:
        assert metrics == {"sampling/groups_dropped": 3, "sampling/rare_action_groups": 1}
        assert [t.group for t in trained] == [0, 0, 1, 1]
        assert (updated["adv/rare_action_tokens"], updated["adv/rare_verbs"], updated["update/trajectories"]) == (2, 1, 3)
        assert seen[0][2].tolist() == [0.0, 0.5, 0.0, 0.0]  # the kept tied row: "pickup" raised
        assert trainer.update(trained, 1)["adv/rare_action_tokens"] == 0  # counted over the kept rows alone
    else:
        assert metrics == {"sampling/groups_dropped": 4} and {t.group for t in trained} == {0}
        assert updated["adv/rare_action_tokens"] == 0 and updated["update/trajectories"] == 2
    # Through the loop, a step of groups 0-2: at share 0.4 "pickup" is rare over the step's 6
    # actions (2 <= 2.4), not over the 4 of groups 0 and 1 (2 > 1.6) nor the 2 of group 0 (1 > 0.8).
    name = f"rare_fit_{keeps_rare}"
    again = RLTrainer(toy_config(tmp_path, "algo.tasks_per_step=3", "algo.rare_action_share=0.4", *settings,
                                 "train.steps=1", "train.validate_every=0", name=name), log=lambda _: None)
    again._play = lambda tasks, *args, **kwargs: rows[:6]
    again.fit()
    row = next(json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
               if "train/success" in line)
    assert (row.get("sampling/rare_action_groups"), row["adv/rare_action_tokens"]) == ((1, 2) if keeps_rare else
                                                                                         (None, 0))


def test_a_step_that_dapos_filter_left_empty_says_why():
    from agentgym_rl.train.rl import no_update_reason

    assert no_update_reason({"update/trajectories": 0, "sampling/groups_dropped": 4}).startswith(
        "DAPO's filter dropped all 4 groups")


def test_right_token_loss_raises_the_probability_of_the_listed_continuation(tmp_path, counter_env_registered):
    """Every row's reply went wrong at position 1, where token 12 would have continued a
    listed action. Without a penalty the tied group has no advantage, yet the right-token
    term trains on it; and an update makes token 12 there more likely (a sign error fails)."""
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "algo.kl_coef=0", "algo.right_token_coef=1.0", "algo.epochs=1", "optim.lr=0.01")
    trainer = RLTrainer(config, log=lambda _: None)
    trainer._setup(resume=False)
    assert trainer.engine.config.locate_wrong_tokens
    rows = [Trajectory("counter", "counter_1", "goal1", group=group, input_ids=[5, 6, 7, 8, 9, 10, 11],
                       loss_mask=[0, 1, 1, 0, 0, 1, 1], logprobs=[0.0, -1.0, -1.0, 0.0, 0.0, -1.0, -1.0],
                       turn_rewards=[0.0, reward], invalid_turns=[0], wrong_tokens=[1], right_tokens=[[12]])
            for group, reward in [(0, 1.0), (0, 0.0), (1, 0.0), (1, 0.0)]]
    first = trainer.update(rows, step=0)
    assert first["update/trajectories"] == 4
    second = trainer.update(rows, step=1)
    assert second["update/right_prob"] > first["update/right_prob"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grpo_learns_the_toy_game(tmp_path, counter_env_registered, dtype):
    """The whole loop improves a policy: from a random tiny model, GRPO learns to say "count"
    (a sign or masking error anywhere in rollout → advantage → loss → update fails this), with
    the learner's trunk computing in float32 or bfloat16 (`optim.compute_dtype`)."""
    from agentgym_rl.train.rl import RLTrainer

    config = toy_config(tmp_path, "algo.tasks_per_step=4", "algo.group_size=8", "algo.minibatch_size=32",
                        "rollout.max_new_tokens=3", "schedule.horizons=[3]", "train.steps=40",
                        "train.validate_every=0", "train.save_every=100", "train.save_trajectories=false",
                        "optim.lr=0.003", f"optim.compute_dtype={dtype}")
    RLTrainer(config, log=lambda _: None).fit()
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[:10], rows[-10:]
    assert sum(r["train/success"] for r in first) / 10 < 0.1
    assert sum(r["train/success"] for r in last) / 10 > 0.25
    assert sum(r["train/invalid_action_rate"] for r in last) < sum(r["train/invalid_action_rate"] for r in first)


def test_a_warm_up_reads_its_demonstrations_from_a_file(tmp_path, capsys, monkeypatch):
    from test_env_e2e import TINY_RUN
    from test_cli import cli

    demos = tmp_path / "demos.jsonl"
    code, _, err = cli("collect", "--env", "babyai", "--policy", "expert", "--episodes", "4",
                       "--env-arg", "list_actions=false", "--out", str(demos))
    assert code == 0, err[-2000:]
    run = [*TINY_RUN, "env.id=babyai", "env.kwargs={list_actions: false}", f"warmup.path={demos}",
           "warmup.episodes=4", "model.corpus_episodes=4", f"run.output_dir={tmp_path}"]
    code, out, err = cli("train", str(REPO / "configs" / "babyai_grpo.yaml"), *run, "run.name=a")
    assert code == 0, err[-2000:]
    assert f"warm-up demonstrations from {demos}: 4 episodes, 4 successful" in out
    assert "expert demonstrations" not in err  # nothing was played
    assert "warm-up: 4 expert demonstrations" in out

    code, _, err = cli("train", str(REPO / "configs" / "babyai_grpo.yaml"), *run,
                       "env.id=textcraft", "env.kwargs={}", "run.name=b")
    assert code == 2 and "holds episodes of babyai, not of the run's env 'textcraft'" in err

    # With a color-permuted copy of each: twice the demonstrations.
    code, out, err = cli("train", str(REPO / "configs" / "babyai_grpo.yaml"), *run,
                         "warmup.augment=1", "run.name=c")
    assert code == 0, err[-2000:]
    assert "warm-up: 8 expert demonstrations (with 1 renamed copies of each)" in out


def test_renamed_copies_of_an_env_without_them_are_a_user_error(tmp_path, capsys, monkeypatch):
    from test_env_e2e import TINY_RUN
    from test_cli import cli

    code, _, err = cli("train", str(REPO / "configs" / "web_grpo.yaml"), *TINY_RUN,
                       "warmup.episodes=2", "warmup.augment=1", f"run.output_dir={tmp_path}")
    assert code == 2 and "environment 'web' has no renamed copies" in err and "babyai" in err
    assert not (tmp_path / "web_grpo").exists()  # refused before any work


def test_a_step_line_shows_what_the_step_logged():
    from agentgym_rl.train.console import step_line

    metrics = {"horizon": 8, "train/success": 0.25, "train/reward": 0.3125, "train/reward_std": 0.1,
               "train/reply_tokens": 12.25, "update/loss": -0.012344, "update/lr": 1e-6, "update/entropy": 1.4567,
               "update/grad_norm": 1.2345, "update/approx_kl": 0.0031, "update/clip_fraction": 0.0213,
               "update/optimizer_steps": 4, "time/rollout_tokens_per_s": 411.6, "time/rollout_s": 4.0,
               "time/update_s": 2.06, "time/step_s": 5.2}
    assert step_line(3, 30, metrics) == ("step 3/30  horizon 8  success 0.25  reward 0.312 ± 0.100  reply 12.2  "
                                         "loss -0.01234  lr 1e-06  entropy 1.457  grad_norm 1.23  drift_kl 0.0031  "
                                         "clipped 0.021  tokens/s 412  5.2 s")
    # One optimizer step: its only minibatch was scored by the weights that sampled it, so the
    # drift figures read 0 by construction and are left out.
    one_pass = step_line(3, 30, {**metrics, "update/optimizer_steps": 1})
    assert "drift_kl" not in one_pass and "clipped" not in one_pass and "entropy 1.457" in one_pass
    # A step that updated nothing has no loss: left out, not printed as 0.
    assert step_line(1, 2, {"horizon": 2, "train/success": 0.0}) == "step 1/2  horizon 2  success 0.00  0.0 s"


@pytest.mark.slow
def test_a_mix_of_babyai_and_textcraft_trains_resumes_and_reports_each_environment(tmp_path):
    """configs/mix_grpo.yaml with the tiny settings: every step plays one task of each environment
    (tasks_per_step 2, weights 1:1; the success curriculum picks its category) and logs both, validations score one item of each, resume goes
    on with the same mix, and the report, TensorBoard and the viewer see the per-env curves."""
    from fastapi.testclient import TestClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentgym_rl.ui.app import create_app

    run_dir = train(tmp_path, "mix", "train.steps=2", "curriculum.kind=success", config="mix_grpo.yaml")
    train(tmp_path, "mix", "train.steps=3", "curriculum.kind=success", config="mix_grpo.yaml", resume=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/success" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        assert {"train/env/babyai/success", "train/env/textcraft/success", "train/env/textcraft/reward"} <= set(row)
        # the curriculum's categories are named with their environment, and shared out within it
        for env_id, category in (("babyai", "GoTo"), ("textcraft", "depth 1")):
            shares = [v for k, v in row.items() if k.startswith(f"curriculum/share/{env_id}/")]
            assert f"curriculum/success/{env_id}/{category}" in row and sum(shares) == pytest.approx(1.0)
    for step in (1, 2, 3):
        played = load_trajectories(run_dir / "trajectories" / f"step_{step:06d}.jsonl")
        assert sorted({t.env_id for t in played}) == ["babyai", "textcraft"] and len(played) == 6
    validations = [r for r in rows if "val/success" in r]
    assert [r["step"] for r in validations] == [0, 2, 3]  # every 2 steps, and after the last
    assert all({"val/env/babyai/success", "val/env/textcraft/success"} <= set(r) for r in validations)
    # Resuming with another mix is refused: its checkpoints learnt these environments.
    result = run("train", str(REPO / "configs" / "mix_grpo.yaml"), *TINY, f"run.output_dir={tmp_path}", "run.name=mix",
                 "train.steps=4", "env.kwargs={members: [{id: babyai}]}", "--resume")
    assert result.returncode == 2 and "env.kwargs.members" in result.stderr
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    assert {"train/env/babyai/success", "val/env/textcraft/success"} <= set(events.Tags()["scalars"])
    assert (run_dir / "report" / "training.png").is_file()
    served = TestClient(create_app(tmp_path, allowed_hosts=["testserver"])).get("/api/runs/mix").json()
    assert any("train/env/textcraft/success" in row for row in served["metrics"])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_rollouts_from_a_bfloat16_copy_of_a_float32_learner(tmp_path, counter_env_registered, asynchronous):
    """`rollout.dtype: bfloat16`: the generator samples from a bfloat16 copy, refreshed after every
    update (it equals the learner's weights, rounded), the learner keeps float32 and measures the
    copy's rounding as the logprob gap; validation samples the float32 weights. A run that would
    let the gap into PPO's ratio is refused. (A shaped reward, `env.reward`, gives the untrained
    model's steps a signal, so that they update.)"""
    import torch

    from agentgym_rl.train.rl import RLTrainer, not_alongside

    config = toy_config(tmp_path, "rollout.dtype=bfloat16", "train.steps=2", "train.validate_every=2",
                        "algo.kl_coef=0", "env.reward=reward_fns:reply_chars",
                        f"train.asynchronous={str(asynchronous).lower()}",
                        "rollout.max_staleness=0", name=f"bf16_{asynchronous}")
    lines: list[str] = []
    trainer = RLTrainer(config, log=lines.append)
    trainer.fit()
    learner = trainer.learner
    assert next(learner.model.parameters()).dtype == torch.float32
    assert next(learner.rollout_model.parameters()).dtype == torch.bfloat16
    # Float buffers (rotary frequencies) keep float32: positions far into an episode stay exact.
    assert all(b.dtype == torch.float32 for b in learner.rollout_model.buffers() if b.is_floating_point())
    assert trainer.policy.generator.model is learner.rollout_model
    assert trainer.val_policy.generator.model is learner.model
    if not asynchronous:  # synced after the last update (played ahead, it loads them before its next step)
        for (name, ours), theirs in zip(learner.model.named_parameters(), learner.rollout_model.parameters()):
            assert torch.equal(ours.detach().to(torch.bfloat16), theirs.detach()), name
    rows = [json.loads(line) for line in (tmp_path / f"bf16_{asynchronous}" / "metrics.jsonl").read_text().splitlines()]
    gaps = [row["rollout/logprob_gap_mean"] for row in rows if "rollout/logprob_gap_mean" in row]
    assert gaps and all(gap > 1e-4 for gap in gaps)  # float32 alone gives ~1e-7
    assert any("sample from a bfloat16 copy of the model" in line for line in lines)
    assert not_alongside(toy_config(tmp_path, "rollout.dtype=bfloat16", "algo.recompute_old_logprobs=false"), 1) == \
        "rollout.dtype: bfloat16 does not run with algo.recompute_old_logprobs: false yet: drop one of the two"
    assert not_alongside(toy_config(tmp_path, "train.asynchronous=true", "train.partial_rollouts=true",
                                    "algo.recompute_old_logprobs=false"), 1).startswith(
        "train.partial_rollouts does not run with algo.recompute_old_logprobs: false")


def test_a_bfloat16_copy_of_a_lora_model_trains_and_resumes(tmp_path, counter_env_registered):
    """With a LoRA adapter the bfloat16 copy holds the adapter and the base, cast; after each
    update it takes the adapter's new weights by name; a resumed run builds it again from the
    checkpoint (which holds the float32 learner's weights, not the copy's)."""
    import torch

    from agentgym_rl.train.rl import RLTrainer

    def fit(steps, resume=False):
        config = toy_config(tmp_path, "rollout.dtype=bfloat16", "model.lora_rank=4", f"train.steps={steps}",
                            "train.validate_every=0", "train.save_every=1", "algo.kl_coef=0",
                            "env.reward=reward_fns:reply_chars", name="bf16_lora")
        trainer = RLTrainer(config, log=lambda _: None)
        trainer.fit(resume=resume)
        return trainer

    for trainer in (fit(1), fit(2, resume=True)):
        learner = trainer.learner
        trained = {name: p for name, p in learner.model.named_parameters() if p.requires_grad}
        copied = dict(learner.rollout_model.named_parameters())
        assert trained and all(copied[name].dtype == torch.bfloat16 for name in trained)
        for name, parameter in trained.items():
            assert torch.equal(parameter.detach().to(torch.bfloat16), copied[name].detach()), name
    rows = [json.loads(line) for line in (tmp_path / "bf16_lora" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "train/success" in row] == [1, 2]
    assert all(row["update/trajectories"] > 0 for row in rows if "train/success" in row)


def test_greedy_samples_reach_the_training_rollouts_and_clashes_are_refused(tmp_path, counter_env_registered,
                                                                             monkeypatch):
    """`algo.greedy_samples` is handed to each step's rollout (the engine plays those samples
    greedily: test_rollout_engine), not to validation; a value that leaves no sampled episode,
    or a backend, Ray workers or forks that cannot honour it, are refused before any work."""
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.errors import UserError
    from agentgym_rl.rollout.engine import RolloutEngine
    from agentgym_rl.rollout.trajectory import Trajectory
    from agentgym_rl.train.rl import RLTrainer, greedy_success, not_alongside

    asked: list[tuple[int, int]] = []
    original = RolloutEngine.run

    def run(self, tasks, policy, max_turns, samples=1, *args, greedy_samples=0, **kwargs):
        asked.append((samples, greedy_samples))
        return original(self, tasks, policy, max_turns, samples, *args, greedy_samples=greedy_samples, **kwargs)

    monkeypatch.setattr(RolloutEngine, "run", run)
    config = toy_config(tmp_path, "algo.group_size=2", "algo.greedy_samples=1", "train.steps=1",
                        "train.validate_every=1", "eval.episodes=2")
    RLTrainer(config, log=lambda _: None).fit()
    assert (2, 1) in asked and all(greedy == 0 for samples, greedy in asked if samples == 1)
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    assert 0 <= next(row for row in rows if "train/success" in row)["train/greedy_success"] <= 1
    # By hand: the first episode of each group is its greedy one; 1 of these 2 succeeded.
    played = [Trajectory(env_id="c", item_id=str(group), category="", group=group, success=success)
              for group, success in ((0, True), (0, False), (1, False), (1, True))]
    assert greedy_success(played, 1) == 0.5 and greedy_success(played, 2) == 0.5 and greedy_success(played[1:], 1) == 0
    with pytest.raises(UserError, match="greedy_samples .2. must leave a sampled episode"):
        load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", ["algo.group_size=2", "algo.greedy_samples=2"])
    for setting, says in (("rollout.generator=vllm", "rollout.generator: vllm"),
                          ("rollout.fork_at=1", "rollout.fork_at"),
                          ("rollout.workers=1", "Ray rollout workers (rollout.workers)")):
        assert not_alongside(toy_config(tmp_path, "algo.greedy_samples=1", setting), 1) == \
            f"algo.greedy_samples does not run with {says} yet: drop one of the two"
