"""Asynchronous RL (`train.asynchronous`, `rollout.max_staleness`): steps played ahead in a
thread never from weights more than k updates old, k = 0 is the synchronous run, and the
generator's own copy of the weights shares a LoRA model's frozen base."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_e2e import REPO, TINY

from agentgym_rl.agent.lora import apply_lora
from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from agentgym_rl.rollout.trajectory import Trajectory, load_trajectories
from agentgym_rl.train.asynchronous import RolloutsAhead, staleness_histogram
from agentgym_rl.train.learner import Learner, OptimConfig


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_step_is_played_as_soon_as_its_staleness_allows_and_never_sooner(k):
    """The learner publishes version s + 1 only once the generator has started step s + k (which
    version s allows): step s + k + 1 must not start before that publication, and so every step
    from k on is played with weights exactly k updates old."""
    steps = 7
    started = [threading.Event() for _ in range(steps)]
    loaded = []

    def play(step):
        started[step].set()
        return [Trajectory("toy", f"toy_{step}", "")], {"played": step}

    ahead = RolloutsAhead(play, loaded.append, first=0, last=steps, max_staleness=k, threads=1)
    try:
        for step in range(steps):
            played = ahead.take(step)
            assert (played.step, played.metrics, played.version) == (step, {"played": step}, max(0, step - k))
            assert played.trajectories[0].policy_version == played.version
            if step + k < steps:
                assert started[step + k].wait(10)
            if step + k + 1 < steps:
                assert not started[step + k + 1].wait(0.05), f"step {step + k + 1} ran before version {step + 1}"
            ahead.publish(step + 1, f"w{step + 1}")
    finally:
        ahead.close()
    # Steps k + 1 .. 6 each loaded the version published just before they started.
    assert loaded == [f"w{v}" for v in range(1, steps - k)]


def test_the_generators_error_reaches_the_learner_and_close_returns():
    def play(step):
        if step == 1:
            raise RuntimeError("the environment server died")
        return [], {}

    ahead = RolloutsAhead(play, lambda weights: None, first=0, last=3, max_staleness=1, threads=1)
    assert ahead.take(0).version == 0
    with pytest.raises(RuntimeError, match="server died"):
        ahead.take(1)
    ahead.close()
    with pytest.raises(ValueError, match="max_staleness"):
        RolloutsAhead(play, lambda weights: None, first=0, last=3, max_staleness=-1, threads=1)


def test_staleness_histogram_counts_steps_by_age():
    assert staleness_histogram([2, 0, 1, 2, 2]) == {0: 1, 1: 1, 2: 3}
    assert staleness_histogram([]) == {}


def test_the_generators_copy_shares_a_lora_base_and_takes_published_weights(tiny_tokenizer):
    model = apply_lora(build_model(tiny_tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                                                   num_kv_heads=1, intermediate_size=64,
                                                                   max_positions=64)), rank=2, alpha=4)
    learner = Learner(model, OptimConfig())
    added = learner.detach_rollout_model()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert added == sum(p.numel() * 4 for p in trainable.values()) > 0
    for (name, mine), (_, theirs) in zip(model.named_parameters(), learner.rollout_model.named_parameters()):
        assert (mine.data_ptr() == theirs.data_ptr()) == (name not in trainable), name  # base shared, adapter copied
    with torch.no_grad():
        for p in trainable.values():
            p.add_(1.0)
    copy_of = dict(learner.rollout_model.named_parameters())
    assert all(not torch.equal(copy_of[n], p) for n, p in trainable.items())  # the learner moved on alone
    learner.load_rollout_state(learner.trainable_state())
    assert all(torch.equal(copy_of[n], p) for n, p in trainable.items())


def _fit(tmp_path: Path, name: str, *extra: str, log=lambda _: None) -> Path:
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.train.rl import RLTrainer

    config = load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", [
        *TINY, "env.id=counter", "env.kwargs={}", f"run.output_dir={tmp_path}", f"run.name={name}",
        "train.steps=4", "warmup.episodes=0", "model.corpus_episodes=6", "rollout.threads=1",
        "eval.temperature=1.0", *extra])
    RLTrainer(config, log=log).fit()
    return tmp_path / name


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_asynchronous_with_max_staleness_0_is_the_synchronous_run(tmp_path, counter_env_registered):
    """Same trajectories, weights and metrics (but time/* and the async/ figures) as the
    synchronous run, with sampled validations in between (they share the random stream)."""
    sync = _fit(tmp_path, "sync")
    lines = []
    asynchronous = _fit(tmp_path, "async", "train.asynchronous=true", "rollout.max_staleness=0", log=lines.append)

    def comparable(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "async/"))} for r in _rows(run_dir)]

    assert comparable(sync) == comparable(asynchronous)
    assert [r["async/staleness"] for r in _rows(asynchronous) if "train/success" in r] == [0, 0, 0, 0]
    assert any(r.get("update/trajectories", 0) > 0 for r in _rows(sync))
    for step in range(1, 5):
        name = f"trajectories/step_{step:06d}.jsonl"
        assert (sync / name).read_text() == (asynchronous / name).read_text()
        assert {t.policy_version for t in load_trajectories(sync / name)} == {step - 1}
    a = load_file(sync / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    b = load_file(asynchronous / "checkpoints" / "step_000004" / "model" / "model.safetensors")
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert any("holds its own copy of the trainable weights" in line for line in lines)
    assert "steps trained on data 0 updates old: 4" in lines


def test_with_max_staleness_2_no_step_trains_on_older_weights(tmp_path, counter_env_registered, monkeypatch):
    """The learner updates step s only once the generator has played step s + 2, as far ahead as
    the bound lets it: from step 2 on every step trains on data exactly 2 updates old, never
    older (a generator one step too far ahead would show a 3)."""
    from agentgym_rl.train.rl import RLTrainer

    update, play_step, played = RLTrainer.update, RLTrainer._play_step, [-1]

    def recorded_play(self, step, horizon, between_turns=None):
        result = play_step(self, step, horizon, between_turns)
        played.append(step)
        return result

    def waiting_update(self, trajectories, step, *rest):
        deadline = time.monotonic() + 60
        while max(played) < min(step + 2, 5) and time.monotonic() < deadline:
            time.sleep(0.01)
        return update(self, trajectories, step, *rest)

    monkeypatch.setattr(RLTrainer, "_play_step", recorded_play)
    monkeypatch.setattr(RLTrainer, "update", waiting_update)
    lines = []
    run_dir = _fit(tmp_path, "ahead", "train.asynchronous=true", "rollout.max_staleness=2", "train.steps=6",
                   "train.validate_every=0", log=lines.append)
    staleness = [r["async/staleness"] for r in _rows(run_dir) if "train/success" in r]
    assert staleness == [0, 1, 2, 2, 2, 2], staleness
    for step, stale in enumerate(staleness, start=1):
        trajectories = load_trajectories(run_dir / "trajectories" / f"step_{step:06d}.jsonl")
        assert {t.policy_version for t in trajectories} == {step - 1 - stale}
    assert any(line.startswith("steps trained on data") and "2 updates old" in line for line in lines)


@pytest.mark.parametrize("extra,says", [
    (["rollout.workers=1"], "Ray rollout workers"),
    (["rollout.generator=vllm"], "rollout.generator: vllm"),
])
def test_what_asynchronous_training_does_not_run_with_is_refused(tmp_path, counter_env_registered, extra, says,
                                                                 monkeypatch):
    import importlib.machinery
    import importlib.util

    from agentgym_rl.errors import UserError

    find_spec = importlib.util.find_spec  # vLLM as if installed: the clash is refused, not the missing package
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: importlib.machinery.ModuleSpec(name, None)
                        if name == "vllm" else find_spec(name, *args))

    with pytest.raises(UserError, match=f"train.asynchronous does not run with {says}"):
        _fit(tmp_path, "refused", "train.asynchronous=true", *extra)
    with pytest.raises(UserError, match="rollout.journal_every does not run with train.asynchronous"):
        _fit(tmp_path, "refused", "train.asynchronous=true", "rollout.journal_every=1")


def test_partial_rollouts_load_weights_published_during_a_step_between_its_turns():
    """With `partial`, the playing thread asks for newer weights between turns: a publication
    made while step 1 plays is loaded there (not only before step 2), and each turn's version is
    the one that wrote it; the staleness per turn is counted from them."""
    published, resumed = threading.Event(), threading.Event()
    loaded, versions = [], []

    def play(step, between_turns=None):
        assert between_turns is not None
        if step == 1:
            versions.append(between_turns())  # the first turn: the version the step started with
            published.set()
            assert resumed.wait(10)
            versions.append(between_turns())  # the second turn: the one published meanwhile
            return [Trajectory("toy", "toy_1", "", turn_rewards=[0.0, 0.0], turn_versions=list(versions))], {}
        return [], {}

    ahead = RolloutsAhead(play, loaded.append, first=0, last=2, max_staleness=1, threads=1, partial=True)
    try:
        ahead.take(0)
        assert published.wait(10)
        ahead.publish(1, "w1")
        resumed.set()
        played = ahead.take(1)
    finally:
        ahead.close()
    assert versions == [0, 1] and loaded == ["w1"] and played.version == 0
    assert ahead.extra_metrics(played)["async/turn_staleness_mean"] == pytest.approx((1 + 0) / 2)
    assert ahead.extra_metrics(played)["async/turn_staleness_max"] == 1
    assert ahead.load_newer() == 1 and loaded == ["w1"]  # nothing newer: nothing loaded again


def test_partial_rollouts_at_staleness_0_are_the_synchronous_run_with_versions_per_turn(tmp_path,
                                                                                       counter_env_registered):
    """At k = 0 nothing is published while a step plays, so partial rollouts change nothing but
    recording each turn's version: every turn of step s (1-based) was written by version s - 1,
    the weights after the update before it, so no turn is stale."""
    sync = _fit(tmp_path, "sync_p")
    partial = _fit(tmp_path, "partial", "train.asynchronous=true", "rollout.max_staleness=0",
                   "train.partial_rollouts=true")

    def comparable(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "async/"))} for r in _rows(run_dir)]

    assert comparable(sync) == comparable(partial)
    assert [r["async/turn_staleness_max"] for r in _rows(partial) if "train/success" in r] == [0, 0, 0, 0]
    for step in range(1, 5):
        for trajectory in load_trajectories(partial / "trajectories" / f"step_{step:06d}.jsonl"):
            assert trajectory.turn_versions == [step - 1] * trajectory.turns


def test_partial_rollouts_need_asynchronous_ones():
    from agentgym_rl.config import RLConfig, load_config
    from agentgym_rl.errors import UserError

    with pytest.raises(UserError, match="partial_rollouts .* needs asynchronous: true"):
        load_config(RLConfig, REPO / "configs" / "babyai_grpo.yaml", ["train.partial_rollouts=true"])
