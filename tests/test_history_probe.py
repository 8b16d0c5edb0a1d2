"""`bench/history_probe.py`: the turns where a greedy reply repeated the one before, and the two
contexts it replays them in, counted by hand; the counts with a stand-in model; the command on
the tiny model."""

from __future__ import annotations

import json

import torch
from conftest import bench_script

from agentgym_rl.agent.tiny import build_model
from agentgym_rl.config import TinyModelConfig

SMALL = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)


def conversation() -> list[dict]:
    return [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "example obs"}, {"role": "assistant", "content": "A: go", "loss": False},
        # The example's words again: not a repeat (the example is left out).
        {"role": "user", "content": "obs 1"}, {"role": "assistant", "content": "A: go"},
        {"role": "user", "content": "obs 2"}, {"role": "assistant", "content": "A: go"},  # repeats: index 5
        {"role": "user", "content": "Nothing. obs 2"}, {"role": "assistant", "content": "A: go"},  # repeats: index 7
        {"role": "user", "content": "obs 3"}, {"role": "assistant", "content": "A: turn"},
        {"role": "user", "content": "obs 4"},
    ]


def test_repeat_turns_and_their_contexts_by_hand():
    module = bench_script("history_probe")
    messages = conversation()
    assert module.opening_size(messages) == 3
    assert module.opening_size(messages[:1] + messages[3:]) == 1  # no worked example
    assert module.repeat_turns(messages) == [5, 7]
    assert module.repeat_turns(messages, marker="Nothing.") == [7]
    played, alone = module.contexts(messages, 7)
    assert [m["content"] for m in played] == [m["content"] for m in messages[:8]]
    assert alone == [{"role": "system", "content": "S"}, {"role": "user", "content": "example obs"},
                     {"role": "assistant", "content": "A: go"}, {"role": "user", "content": "Nothing. obs 2"}]


def test_the_command_on_the_tiny_model(tmp_path, tiny_tokenizer, capsys):
    build_model(tiny_tokenizer, SMALL).save_pretrained(tmp_path / "model")
    tiny_tokenizer.save_pretrained(tmp_path / "model")
    validation = tmp_path / "step_000000.jsonl"
    validation.write_text(json.dumps({"item_id": "babyai_0", "messages": conversation()}) + "\n")
    module = bench_script("history_probe")
    assert module.main([str(validation), "--model", str(tmp_path / "model"), "--max-new-tokens", "4"]) == 0
    assert "2 turns whose greedy reply repeated the one before" in capsys.readouterr().out
    assert module.main([str(validation), "--model", str(tmp_path / "model"), "--marker", "Gone"]) == 2
    assert "no reply there repeats the one before after an observation beginning 'Gone'" in capsys.readouterr().err


def test_the_counts_compare_each_context_s_reply_with_the_repeated_one(tmp_path, monkeypatch, capsys):
    """A stand-in model that repeats only when shown the conversation: 2 of 2, then 0 of 2."""
    module = bench_script("history_probe")
    monkeypatch.setattr(module, "load_model_and_tokenizer", lambda folder, dtype: (torch.nn.Identity(), None))
    monkeypatch.setattr(module, "ChatEncoder", lambda tokenizer: None)
    monkeypatch.setattr(module, "greedy_reply",
                        lambda model, encoder, messages, max_new_tokens: "A: go" if len(messages) > 4 else "A: turn")
    validation = tmp_path / "step_000000.jsonl"
    validation.write_text(json.dumps({"item_id": "babyai_0", "messages": conversation()}) + "\n")
    assert module.main([str(validation), "--model", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "with the conversation as played 2 (100%), without it 0 (0%)" in out
    assert "babyai_0: before 'A: go'; without the conversation 'A: turn'" in out
