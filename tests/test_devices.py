"""run.device and run.dtype: the model, the learner's batches and the generator's KV cache follow them.

On these machines only the CPU exists, so the device checks see "cpu"; a CUDA run is the same
code with run.device=cuda. bfloat16 on the CPU exercises the dtype path end to end.
"""

from __future__ import annotations

import pytest
import torch

from agentgym_rl.agent.loading import resolve_device
from agentgym_rl.config import SFTConfig, load_config
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.trajectory import Trajectory
from agentgym_rl.train.batch import collate
from agentgym_rl.train.session import Session

SMALL = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
         "model.tiny.num_kv_heads=2", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=300"]
CORPUS = ["Your goal: go to the red ball.", "Action: go to red ball 1", "Action: turn left"] * 30


def session(tmp_path, *overrides, **learner_options) -> Session:
    config = load_config(SFTConfig, None, [f"run.output_dir={tmp_path}", *SMALL, *overrides])
    return Session.start(config, log=lambda _: None, corpus=lambda: CORPUS, **learner_options)


def test_model_batch_and_cache_follow_bfloat16(tmp_path):
    run = session(tmp_path, "run.dtype=bfloat16", value_head=True)
    params = list(run.model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert {p.device.type for p in params} == {"cpu"}
    # The value head regresses returns in float32 whatever the model's dtype.
    assert run.learner.value_head.weight.dtype == torch.float32

    # Generation: the kept KV cache is in the model's dtype, on its device.
    policy = run.policy(temperature=1.0)
    prompt = run.tokenizer.encode("Your goal: go to the red ball.")
    generations = policy.generator.generate([prompt, prompt[:4]], max_new_tokens=3)
    assert all(len(g.ids) == len(g.logprobs) > 0 for g in generations)
    keys = policy.generator._last.cache.layers[0].keys
    assert keys.dtype == torch.bfloat16 and keys.device.type == "cpu"

    # Learning: batches built on the CPU reach the model's device; log-probabilities are float32.
    ids = prompt + generations[0].ids
    row = Trajectory("babyai", "babyai_0", "GoTo", input_ids=ids,
                     loss_mask=[0] * len(prompt) + [1] * len(generations[0].ids),
                     logprobs=[0.0] * len(prompt) + generations[0].logprobs)
    batch = collate([row], run.tokenizer.pad_token_id)
    scored = run.learner.outputs(batch)
    assert scored.logprobs.dtype == torch.float32 and scored.values.dtype == torch.float32
    before = [p.detach().clone() for p in run.learner.parameters()]
    run.learner.update(batch, lambda b, out: (-(out.logprobs * b.loss_mask).sum(), {}))
    assert any(not torch.equal(a, b) for a, b in zip(before, run.learner.parameters()))


def test_eval_loads_a_model_in_the_configured_dtype(tmp_path):
    from agentgym_rl.eval.evaluate import make_policy

    run = session(tmp_path)
    folder = str(run.run_dir / "base_model")
    policy = make_policy("babyai", folder, temperature=0.0, seed=0, dtype="bfloat16", device="cpu")
    assert {p.dtype for p in policy.generator.model.parameters()} == {torch.bfloat16}


def test_float32_is_the_default(tmp_path):
    run = session(tmp_path)
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}
    assert run.device == torch.device("cpu")


def test_devices_resolve_or_fail_with_one_line():
    config = load_config(SFTConfig, None, ["run.device=auto"])
    assert resolve_device(config.run.device) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="run.device is cuda but torch sees no CUDA device"):
            resolve_device(load_config(SFTConfig, None, ["run.device=cuda"]).run.device)
    with pytest.raises(UserError, match="input should be 'cpu', 'cuda' or 'auto'"):
        load_config(SFTConfig, None, ["run.device=tpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_torchrun_reads_run_device_as_the_model_does(monkeypatch):
    """Under torchrun, run.device=cuda without a GPU is the same one-line error as in one process,
    not a gloo group whose model then fails to load (auto still joins on gloo)."""
    from agentgym_rl.train import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    joined = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **_: joined.append(backend))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    with pytest.raises(UserError, match="run.device is cuda but torch sees no CUDA device"):
        distributed.start("cuda")
    assert joined == []
    assert distributed.start("auto") == (0, 2) and joined == ["gloo"]


def test_the_start_line_names_a_gpu_and_its_memory(monkeypatch):
    """`describe_device`'s CUDA branch, reached on the CPU with torch's device queries stood in
    for (the tests hide GPUs): the GPU's index, name and memory; the CPU's thread count."""
    from types import SimpleNamespace

    from agentgym_rl.agent.loading import describe_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(name=f"NVIDIA H200 #{index}", total_memory=140e9))
    assert describe_device(torch.device("cuda"), "bfloat16") == "device cuda:1 (NVIDIA H200 #1, 140 GB), bfloat16"
    assert describe_device(torch.device("cuda", 0), "float32") == "device cuda:0 (NVIDIA H200 #0, 140 GB), float32"
    threads = torch.get_num_threads()
    assert describe_device(torch.device("cpu"), "float32") == f"device cpu ({threads} threads), float32"


def test_a_step_on_a_gpu_reports_its_peak_memory_and_restarts_the_count(monkeypatch):
    """`memory/device_peak_gb`: the peak since the last step, in GB, on CUDA only (a stand-in for
    torch.cuda records the calls)."""
    import torch

    from agentgym_rl import metric_names as metric
    from agentgym_rl.train.rl import device_peak_gb

    calls = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: calls.append(("peak", device)) or 3.5e9)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: calls.append(("held", device)) or 4.25e9)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    gpu = torch.device("cuda", 0)
    assert device_peak_gb(gpu) == {metric.MEMORY_DEVICE_PEAK_GB: 3.5, metric.MEMORY_DEVICE_RESERVED_GB: 4.25}
    assert calls == [("peak", gpu), ("held", gpu), ("reset", gpu)]
    assert device_peak_gb(torch.device("cpu")) == {} and len(calls) == 3


def test_every_steps_metrics_carry_the_devices_peaks(tmp_path, monkeypatch, counter_env_registered):
    """The trainer asks for the peaks once a step, of the device it trains on, and logs them with
    the step (a stand-in answers as a GPU would)."""
    import json

    from test_run_safety import toy_config

    import agentgym_rl.train.rl as rl
    from agentgym_rl import metric_names as metric

    asked = []
    monkeypatch.setattr(rl, "device_peak_gb", lambda device: asked.append(device.type) or
                        {metric.MEMORY_DEVICE_PEAK_GB: 1.5, metric.MEMORY_DEVICE_RESERVED_GB: 2.0})
    rl.RLTrainer(toy_config(tmp_path, "train.steps=2"), log=lambda _: None).fit()
    steps = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in steps if metric.TIME_STEP_S in row]
    assert asked == ["cpu", "cpu"] and len(steps) == 2
    assert all((row[metric.MEMORY_DEVICE_PEAK_GB], row[metric.MEMORY_DEVICE_RESERVED_GB]) == (1.5, 2.0)
               for row in steps)
