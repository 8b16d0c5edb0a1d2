"""`bench/action_odds.py`: the probability a model gives each listed action as its first reply on
BabyAI items, scored over one shared prompt, and the per-category table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import bench_script

from agentgym_rl.agent.tiny import build_model
from agentgym_rl.config import TinyModelConfig

REPO = Path(__file__).resolve().parent.parent
SMALL = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)


def load_module():
    return bench_script("action_odds")


def test_replies_scored_over_a_shared_prompt_equal_whole_sequences(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SMALL).eval()
    prompt, replies = [5, 17, 42, 8, 99], [[7, 3], [11, 12, 13, 14], [2]]
    scores = load_module().reply_logprobs(model, prompt, replies, temperature=0.5)
    for reply, score in zip(replies, scores):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
        logprobs = (logits / 0.5).log_softmax(-1)
        expected = sum(float(logprobs[len(prompt) - 1 + i, token]) for i, token in enumerate(reply))
        assert score == pytest.approx(expected, abs=1e-4)


def test_the_first_turns_of_babyai_items_and_their_table(tmp_path, tiny_tokenizer, capsys):
    build_model(tiny_tokenizer, SMALL).save_pretrained(tmp_path / "model")
    tiny_tokenizer.save_pretrained(tmp_path / "model")
    out = tmp_path / "rows.json"
    module = load_module()
    assert module.main(["--config", str(REPO / "configs" / "smollm2_babyai_grpo.yaml"), "--model",
                        str(tmp_path / "model"), "--episodes", "4", "--group-size", "4", "--json", str(out)]) == 0
    rows = {row["item_id"]: row for row in json.loads(out.read_text())}
    assert list(rows) == ["babyai_0", "babyai_1", "babyai_2", "babyai_3"]
    assert rows["babyai_0"]["solving"] == ["go to red ball 1", "pickup red ball 1"]  # as bench/babyai_headroom finds
    for row in rows.values():
        assert 0 <= row["p_solve"] <= row["p_listed"] <= 1
        assert row["p_group"] == pytest.approx(1 - (1 - row["p_solve"]) ** 4)
        assert sum(row["by_verb"].values()) == pytest.approx(row["p_listed"])
        assert row["solving"]  # only the items one action solves are scored by default
    table = capsys.readouterr().out
    assert "| all | 4 |" in table and "P(a group of 4 holds one)" in table


def test_each_surface_form_is_read_by_the_environment_as_its_action():
    from agentgym_rl.envs.babyai.actions import parse_action

    forms = load_module().surface_forms("pickup red ball 1")
    assert forms == ["pickup red ball 1", '"pickup red ball 1"', "pick up red ball 1", '"pick up red ball 1"']
    assert {parse_action(form) for form in forms} == {parse_action("pickup red ball 1")}
    assert load_module().surface_forms("turn left") == ["turn left", '"turn left"']


def test_a_temperature_of_zero_is_refused_in_one_line(capsys):
    assert load_module().main(["--temperature", "0"]) == 2
    assert "--temperature must be > 0" in capsys.readouterr().err
