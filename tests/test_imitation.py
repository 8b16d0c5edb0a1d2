"""Imitation learning: loss masks with AgentGym's per-turn flags, packing, and the
collect → sft → eval, dpo and rft commands end to end with a very small model."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import ScriptedGenerator
from safetensors.torch import load_file
from test_cli import cli, run

from agentgym_rl.agent.chat import ChatEncoder
from agentgym_rl.agent.tiny import TinyModelConfig, build_model
from agentgym_rl.rollout.policy import ModelPolicy
from agentgym_rl.rollout.formats import agenttraj_to_trajectory, sft_messages
from agentgym_rl.rollout.trajectory import Trajectory
from agentgym_rl.train.batch import collate
from agentgym_rl.train.learner import TokenOutputs, token_logprobs
from agentgym_rl.train.packing import block_causal_mask, collate_packed, pack
from agentgym_rl.train.learner import Learner, OptimConfig
from agentgym_rl.train.finetune import (lr_multiplier, nll_loss, plan_batches, prepare_sft_data, sft_epochs,
                                        with_context_loss)

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
              "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320"]
SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                        max_positions=256)

# An AgentTraj record in AgentGym's layout: instruction, acknowledgement (loss false), then
# observation / reply turns; the second reply has loss true, the third no flag (= trained).
RECORD = {"item_id": "babyai_3", "conversations": [
    {"from": "human", "loss": None, "value": "Your goal: go to the red ball."},
    {"from": "gpt", "loss": False, "value": "OK."},
    {"from": "human", "loss": None, "value": "You see a red ball 1."},
    {"from": "gpt", "loss": True, "value": "Action: go to red ball 1"},
    {"from": "human", "loss": None, "value": "Nothing happens."},
    {"from": "gpt", "value": "Action: count"},
    {"from": "human", "loss": None, "value": "Counter value is 3."},
]}


# ---------------------------------------------------------------------------- loss masks


def test_loss_mask_covers_trained_assistant_turns_only(tiny_tokenizer):
    encoder = ChatEncoder(tiny_tokenizer)
    messages, train_on = sft_messages(agenttraj_to_trajectory(RECORD))
    assert train_on == [False, False, False, True, False, True, False]
    ids, mask = encoder.encode_conversation(messages, train_on)

    # The tiny template renders "<|role|>\n{content}<|end|>\n"; the encoder cuts it into the
    # rollout's pieces: opening prompt, reply, observation delta, reply, ... (the final
    # observation is not part of what is trained).
    def enc(text):
        return tiny_tokenizer.encode(text, add_special_tokens=False)

    end = [encoder.end_of_turn_id]
    pieces = [  # (token ids, trained?)
        (enc("<|user|>\nYour goal: go to the red ball.<|end|>\n<|assistant|>\n"), 0),
        (enc("OK.") + end, 0),                                   # the acknowledgement: loss false
        (enc("\n<|user|>\nYou see a red ball 1.<|end|>\n<|assistant|>\n"), 0),
        (enc("Action: go to red ball 1") + end, 1),              # loss true
        (enc("\n<|user|>\nNothing happens.<|end|>\n<|assistant|>\n"), 0),
        (enc("Action: count") + end, 1),                         # no flag: trained
    ]
    assert ids == [t for piece, _ in pieces for t in piece]
    assert mask == [flag for piece, flag in pieces for _ in piece]
    # Hand-checked positions: the first trained token comes right after the three
    # untrained pieces, and the trained tokens spell exactly the two replies.
    first = mask.index(1)
    assert first == sum(len(p) for p, _ in pieces[:3])
    assert ids[first:first + len(pieces[3][0])] == pieces[3][0]
    assert mask[first - 1] == 0 and ids[first - 1 - len(pieces[2][0]) + 1] == pieces[2][0][0]
    trained = tiny_tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "Action: go to red ball 1<|end|>Action: count<|end|>"
    # The acknowledgement's tokens are in the context (mask 0) at the position after the prompt.
    ack_at = len(pieces[0][0])
    assert ids[ack_at:ack_at + len(pieces[1][0])] == pieces[1][0] and not any(mask[ack_at:first])

    # Without flags every assistant reply is trained (the encoder's default, unchanged).
    ids_all, mask_all = encoder.encode_conversation(messages)
    assert ids_all == ids
    assert [a - b for a, b in zip(mask_all, mask)] == [int(ack_at <= i < ack_at + len(pieces[1][0]))
                                                       for i in range(len(ids))]
    with pytest.raises(ValueError, match="only assistant replies"):
        encoder.encode_conversation(messages, [True] + train_on[1:])


def test_prepare_sft_data_counts_and_skips(tiny_tokenizer):
    encoder = ChatEncoder(tiny_tokenizer)
    untrained = json.loads(json.dumps(RECORD))
    for turn in untrained["conversations"]:
        if turn["from"] == "gpt":
            turn["loss"] = False
    conversations = [agenttraj_to_trajectory(RECORD), agenttraj_to_trajectory(untrained)]
    data, stats = prepare_sft_data(conversations, max_tokens=10_000, encoder=encoder)
    assert (stats.kept, stats.no_loss, stats.too_long, stats.trained_turns) == (1, 1, 0, 2)
    assert stats.trained_tokens == sum(data[0].loss_mask)
    _, stats = prepare_sft_data(conversations, max_tokens=10, encoder=encoder)
    assert (stats.kept, stats.no_loss, stats.too_long) == (0, 1, 1)


# ------------------------------------------------------------------------------- packing


def test_pack_is_first_fit_decreasing():
    # Longest first: 6 → row 0 (2 left), 5 → row 1 (3 left), 4 → row 2 (4 left),
    # 3 → row 1 (0 left), 2 → row 0 (0 left).
    assert pack([5, 3, 4, 2, 6], 8) == [[4, 3], [0, 1], [2]]
    assert pack([9, 1], 8) == [[0], [1]]  # a document longer than a row gets its own
    # Rows by packed length (4, 8, 8; ties by content), then batches of 2 rows.
    assert plan_batches([5, 3, 4, 2, 6], 2, pack_tokens=8) == [[[2], [0, 1]], [[4, 3]]]
    assert plan_batches([5, 3, 4], 2) == [[[1], [2]], [[0]]]  # no packing: one per row, by length


def test_batches_are_redrawn_each_epoch_and_bucketed_inside_windows():
    import random

    lengths = [7, 3, 9, 1, 5, 8, 2, 6, 4, 10]
    rng = random.Random(0)
    first, second = plan_batches(lengths, 2, rng=rng, window=2), plan_batches(lengths, 2, rng=rng, window=2)
    for batches in (first, second):
        rows = [row for batch in batches for row in batch]
        assert sorted(i for row in rows for i in row) == list(range(10))  # each conversation once
        assert all(len(b) == 2 for b in batches)
    assert first != second
    # With one window over everything the batches are those of the global length sort, in
    # another order.
    everything = plan_batches(lengths, 2, rng=random.Random(1), window=100)
    assert sorted(everything) == sorted(plan_batches(lengths, 2)) and everything != plan_batches(lengths, 2)


def test_lr_multiplier_by_hand():
    assert [lr_multiplier("constant", s, 10, warmup_steps=2) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    # cosine over 10 steps: 0.5 * (1 + cos(pi * s / 10)).
    assert lr_multiplier("cosine", 0, 10) == 1.0
    assert lr_multiplier("cosine", 5, 10) == pytest.approx(0.5)
    assert lr_multiplier("cosine", 10, 10) == pytest.approx(0.0)
    # 4 warm-up steps (0.25, 0.5, 0.75, 1), then the cosine over the 10 remaining steps.
    assert [lr_multiplier("cosine", s, 14, warmup_steps=4) for s in (0, 3)] == [0.25, 1.0]
    assert lr_multiplier("cosine", 4, 14, warmup_steps=4) == 1.0
    assert lr_multiplier("cosine", 9, 14, warmup_steps=4) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown lr schedule"):
        lr_multiplier("linear", 0, 10)


def test_sft_epochs_follows_the_schedule_and_restores_the_lr(tiny_tokenizer):
    model = build_model(tiny_tokenizer, SMALL)
    learner = Learner(model, OptimConfig(lr=0.01))
    docs = [Trajectory("e", f"e_{i}", "c", input_ids=[5 + i, 6, 7, 8], loss_mask=[0, 1, 1, 1]) for i in range(3)]
    seen = []
    sft_epochs(learner, docs, tiny_tokenizer.pad_token_id, epochs=2, batch_size=1, lr_schedule="cosine",
               on_step=lambda metrics: seen.append(metrics["lr"]))
    expected = [0.01 * 0.5 * (1 + math.cos(math.pi * s / 6)) for s in range(6)]
    assert seen == pytest.approx(expected)
    assert learner.optimizer.param_groups[0]["lr"] == 0.01


def test_context_loss_weights_the_other_tokens_by_hand():
    doc = Trajectory("e", "e_0", "c", input_ids=[5, 6, 7, 8, 9], loss_mask=[0, 0, 1, 1, 0])
    weighted = with_context_loss(doc, 0.25)
    assert weighted.loss_mask == [0.0, 0.25, 1.0, 1.0, 0.25]  # nothing predicts the first token
    assert doc.loss_mask == [0, 0, 1, 1, 0]
    batch = collate([weighted], pad_id=0)
    logprobs = torch.tensor([[0.0, -1.0, -2.0, -3.0, -8.0]])
    loss, _ = nll_loss(batch, TokenOutputs(logprobs))
    # (0.25 * 1 + 2 + 3 + 0.25 * 8) / (0.25 + 1 + 1 + 0.25) = 7.25 / 2.5; the replies alone: 2.5
    assert loss.item() == pytest.approx(2.9)


def test_packed_rows_score_each_document_as_if_alone(tiny_tokenizer):
    """Block-diagonal attention: a packed document's logprobs equal its own row's, so the
    token-mean loss of a packed batch equals the unpacked one."""
    model = build_model(tiny_tokenizer, SMALL).eval()
    docs = [Trajectory("e", f"e_{i}", "c", input_ids=ids, loss_mask=[0] + [1] * (len(ids) - 1))
            for i, ids in enumerate([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]])]
    pad = tiny_tokenizer.pad_token_id
    plain = collate(docs, pad)
    packed = collate_packed([[docs[0], docs[1]], [docs[2]]], pad)
    assert packed.segment_ids[0].tolist() == [1] * 7 + [2] * 3
    assert packed.position_ids[0].tolist() == list(range(7)) + list(range(3))
    with torch.no_grad():
        alone, together = token_logprobs(model, plain), token_logprobs(model, packed)
    assert torch.allclose(together[0, 1:7], alone[0, 1:7], atol=1e-5)
    assert torch.allclose(together[0, 8:10], alone[1, 1:3], atol=1e-5)   # doc 2 starts at 7
    assert torch.allclose(together[1, 1:5], alone[2, 1:5], atol=1e-5)
    # Attention crossing documents would change doc 2's logprobs: the mask matters.
    no_mask = dataclasses.replace(packed, segment_ids=None, position_ids=None)
    with torch.no_grad():
        crossing = token_logprobs(model, no_mask)
    assert not torch.allclose(crossing[0, 8:10], alone[1, 1:3], atol=1e-3)
    loss_plain, _ = nll_loss(plain, TokenOutputs(alone))
    loss_packed, _ = nll_loss(packed, TokenOutputs(together))
    assert loss_plain.item() == pytest.approx(loss_packed.item(), abs=1e-5)


def test_block_causal_mask_with_a_window_by_hand():
    allowed = block_causal_mask(torch.tensor([[1, 1, 1, 1, 2, 2]]), window=2)[0, 0] == 0
    assert allowed.long().tolist() == [[1, 0, 0, 0, 0, 0],
                                       [1, 1, 0, 0, 0, 0],
                                       [0, 1, 1, 0, 0, 0],
                                       [0, 0, 1, 1, 0, 0],
                                       [0, 0, 0, 0, 1, 0],
                                       [0, 0, 0, 0, 1, 1]]


def test_a_sliding_window_model_scores_packed_documents_as_if_alone(tiny_tokenizer):
    """The tiny model's `sliding_window` holds in packed batches too (where the trainer builds
    the attention masks itself), and it is not a no-op."""
    model = build_model(tiny_tokenizer, dataclasses.replace(SMALL, sliding_window=3)).eval()
    full = build_model(tiny_tokenizer, SMALL).eval()
    docs = [Trajectory("e", f"e_{i}", "c", input_ids=ids, loss_mask=[0] + [1] * (len(ids) - 1))
            for i, ids in enumerate([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17]])]
    pad = tiny_tokenizer.pad_token_id
    with torch.no_grad():
        alone = token_logprobs(model, collate(docs, pad))
        together = token_logprobs(model, collate_packed([docs], pad))
        unwindowed = token_logprobs(full, collate(docs, pad))
    assert torch.allclose(together[0, 1:7], alone[0, 1:7], atol=1e-5)
    assert torch.allclose(together[0, 8:13], alone[1, 1:6], atol=1e-5)
    # Within the window both models agree (same seed, same weights); beyond it they differ.
    assert torch.allclose(alone[0, 1:3], unwindowed[0, 1:3], atol=1e-5)
    assert not torch.allclose(alone[0, 4:7], unwindowed[0, 4:7], atol=1e-3)


# ------------------------------------------------------------------ CLI, end to end (fast)


def ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """Expert demonstrations collected by the CLI, and a tiny model fine-tuned on them."""
    root = tmp_path_factory.mktemp("imitation")
    demos = root / "demos.jsonl"
    result = ok(run("collect", "--env", "babyai", "--policy", "expert", "--episodes", "8", "--out", str(demos),
                    "--env-arg", "list_actions=true", "--successes-only"))
    assert "collected 8 episodes (8 items × 1)" in result.stdout and str(demos) in result.stdout
    records = [json.loads(line) for line in demos.read_text().splitlines()]
    assert records and all(r["success"] for r in records) and all("conversations" in r for r in records)
    ok(run("sft", str(REPO / "configs" / "babyai_sft.yaml"), f"data.path={demos}",
           "model.corpus_episodes=8", *TINY_MODEL, "train.epochs=2", "train.batch_size=4",
           f"run.output_dir={root}", "run.name=sft"))
    return root


def test_collect_takes_the_first_items_unless_told_to_spread_them(tmp_path):
    from agentgym_rl.envs import registry

    categories = {task.item_id: task.category for task in registry.tasks("babyai", "train")}
    drawn = {}
    for items in ("first", "stratified"):
        out = tmp_path / f"{items}.jsonl"
        ok(run("collect", "--env", "babyai", "--policy", "expert", "--episodes", "4", "--out", str(out),
               *(["--items", items] if items == "stratified" else [])))
        drawn[items] = [json.loads(line)["item_id"] for line in out.read_text().splitlines()]
    assert drawn["first"] == list(categories)[:4]
    assert len({categories[item] for item in drawn["stratified"]}) == 4


def test_collect_sft_eval(sft_run):
    run_dir = sft_run / "sft"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and rows[0]["data/kept"] > 0 and rows[0]["data/trained_turns"] > 0
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))
    assert [r["epoch"] for r in rows if "epoch_loss" in r] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert (run_dir / "config.yaml").is_file()
    model = run_dir / "checkpoints" / "final" / "model"
    base = load_file(run_dir / "base_model" / "model.safetensors")
    trained = load_file(model / "model.safetensors")
    assert any(not torch.equal(base[k], trained[k]) for k in base)
    out = sft_run / "eval.json"
    ok(run("eval", "--env", "babyai", "--policy", str(model), "--episodes", "2", "--max-turns", "2",
           "--temperature", "0", "--env-arg", "list_actions=true", "--json", str(out)))
    assert json.loads(out.read_text())["episodes"] == 2


def test_dpo_on_collected_pairs(sft_run, capsys, monkeypatch):
    pairs_file = sft_run / "random.jsonl"
    code, out, _ = cli("collect", "--env", "babyai", "--policy", "random", "--episodes", "6",
                       "--samples", "4", "--max-turns", "3", "--format", "trajectory", "--out", str(pairs_file),
                       "--env-arg", "list_actions=true")
    assert code == 0 and "collected 24 episodes (6 items × 4)" in out
    ok(run("dpo", str(REPO / "configs" / "babyai_dpo.yaml"), f"model.path={sft_run / 'sft/checkpoints/final/model'}",
           f"data.path={pairs_file}", "eval.episodes=0", "dpo.epochs=1", "dpo.batch_size=2",
           "optim.micro_batch_size=2", f"run.output_dir={sft_run}", "run.name=dpo"))
    rows = [json.loads(line) for line in (sft_run / "dpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert rows[0]["pairs"] > 0 and len(steps) == math.ceil(rows[0]["pairs"] / 2)
    # Before the first update the policy is the reference: every margin is 0, loss = log 2.
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert steps[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert (sft_run / "dpo" / "checkpoints" / "final" / "model" / "config.json").is_file()


def test_rft_rounds(sft_run):
    ok(run("rft", str(REPO / "configs" / "babyai_rft.yaml"), f"model.path={sft_run / 'sft/checkpoints/final/model'}",
           "rft.rounds=2", "rft.items=2", "rft.samples_per_item=2", "rft.max_turns=2", "eval.episodes=2",
           "eval.max_turns=2", "rollout.max_new_tokens=12", f"run.output_dir={sft_run}", "run.name=rft"))
    run_dir = sft_run / "rft"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/success" in r] == [0, 1, 2]
    assert [r["step"] for r in rows if "sample/success" in r] == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["round_001", "round_002"]
    assert len((run_dir / "trajectories" / "round_002.jsonl").read_text().splitlines()) == 4


# ------------------------------------------------- trainers on the toy env (scripted policy)


def scripted(replies):
    def policy(model, tokenizer, temperature, rollout=None, listed_actions_only=False, engine=None):
        encoder = ChatEncoder(tokenizer)
        return ModelPolicy(ScriptedGenerator(tokenizer, replies, encoder.end_of_turn_id), encoder)
    return policy


TOY = [*TINY_MODEL, "env.id=counter", "env.kwargs={}", "model.path=null", "model.corpus_episodes=6",
       "warmup.episodes=0", "rollout.max_new_tokens=16"]


def test_rft_fine_tunes_on_its_successes(tmp_path, counter_env_registered, monkeypatch):
    """Counter items need 1-3 "count"s in 2 turns; replies alternate count / look, so some
    samples succeed and some fail: the successes (deduplicated) are trained on."""
    from agentgym_rl.train import rft, session
    from agentgym_rl.config import RFTConfig, load_config

    monkeypatch.setattr(session, "model_policy", scripted(["Action: count", "Action: look"]))
    config = load_config(RFTConfig, REPO / "configs" / "babyai_rft.yaml", [
        *TOY, f"run.output_dir={tmp_path}", "run.name=toy", "rft.items=6", "rft.samples_per_item=2", "rft.max_turns=2",
        "eval.episodes=0", "train.epochs=1"])
    [start, first] = rft.RFTTrainer(config, log=lambda _: None).fit()
    assert start["eval"] is None
    assert 0 < first["sample/success"] < 1 and first["sft/conversations"] > 0
    assert "sft/loss_first_epoch" in first
    trajectories = [json.loads(line) for line in (tmp_path / "toy/trajectories/round_001.jsonl").read_text().splitlines()]
    successes = {(t["item_id"], tuple(t["input_ids"])) for t in trajectories if t["success"]}
    assert first["sft/conversations"] == len(successes)  # identical successes kept once
    base = load_file(tmp_path / "toy" / "base_model" / "model.safetensors")
    trained = load_file(tmp_path / "toy" / "checkpoints" / "round_001" / "model" / "model.safetensors")
    assert any(not torch.equal(base[k], trained[k]) for k in base)


def test_dpo_samples_pairs_and_uses_the_adapter_free_base_as_reference(tmp_path, counter_env_registered, monkeypatch):
    from agentgym_rl.train import dpo, session
    from agentgym_rl.config import DPOConfig, load_config

    monkeypatch.setattr(session, "model_policy", scripted(["Action: count", "Action: look", "Action: look"]))
    config = load_config(DPOConfig, REPO / "configs" / "babyai_dpo.yaml", [
        *TOY, f"run.output_dir={tmp_path}", "run.name=toy", "data.items=6", "data.samples_per_item=3",
        "data.max_turns=2", "eval.episodes=0", "model.lora_rank=4", "dpo.epochs=4", "dpo.batch_size=4",
        "optim.lr=0.05", "optim.micro_batch_size=2"])
    result = dpo.DPOTrainer(config, log=lambda _: None).fit()
    assert result["pairs"] > 0
    assert len((tmp_path / "toy/trajectories/samples.jsonl").read_text().splitlines()) == 18
    rows = [json.loads(line) for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # LoRA starts as the base
    # The policy moved away from the reference, towards the chosen replies. Single batches are
    # noisy at this size (a batch's margin can stay near 0), so compare epoch means.
    margins: dict[int, list[float]] = {}
    for row in steps:
        margins.setdefault(row["epoch"], []).append(row["rewards/margin"])
    first, last = (sum(margins[e]) / len(margins[e]) for e in (1, max(margins)))
    assert last > 0 and last > first
    base = load_file(tmp_path / "toy" / "lora_base" / "model.safetensors")
    merged = load_file(tmp_path / "toy" / "checkpoints" / "final" / "model" / "model.safetensors")
    assert any(not torch.equal(base[k], merged[k]) for k in base)
    assert (tmp_path / "toy" / "checkpoints" / "final" / "adapter").is_dir()


# ------------------------------------------------------------------------------ bad input


def write(path: Path, *lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def sft_args(tmp_path, *extra):
    return ["sft", str(REPO / "configs" / "babyai_sft.yaml"), "data.successes_only=false",
            f"run.output_dir={tmp_path}", *extra]


def test_bad_input_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    good = RECORD
    no_reply = {"item_id": "babyai_1", "conversations": [{"from": "human", "value": "hello"}]}
    untrained = json.loads(json.dumps(RECORD))
    for turn in untrained["conversations"]:
        if turn["from"] == "gpt":
            turn["loss"] = False
    bad_role = {"item_id": "babyai_2", "conversations": [{"from": "robot", "value": "x"}]}
    scored = {**RECORD, "success": True, "reward": 1.0}
    cases = [
        (sft_args(tmp_path, f"data.path={tmp_path / 'missing.jsonl'}"),
         f"conversation file '{tmp_path / 'missing.jsonl'}' does not exist"),
        (sft_args(tmp_path, f"data.path={write(tmp_path / 'schema.jsonl', good, bad_role)}"),
         f"{tmp_path / 'schema.jsonl'}:2: conversations[0].from is \"robot\""),
        (sft_args(tmp_path, f"data.path={write(tmp_path / 'noreply.jsonl', good, good, no_reply)}"),
         f"{tmp_path / 'noreply.jsonl'}:3: the conversation has no 'gpt' turn"),
        (sft_args(tmp_path, f"data.path={write(tmp_path / 'json.jsonl', good, '{oops')}"),
         f"{tmp_path / 'json.jsonl'}:2: invalid JSON"),
        (sft_args(tmp_path, f"data.path={write(tmp_path / 'flags.jsonl', untrained)}"),
         "no trainable conversation in"),
        (sft_args(tmp_path, f"data.path={write(tmp_path / 'ok.jsonl', good)}", "model.path=/no/such/model"),
         "model path '/no/such/model' is not a directory with a config.json"),
        (sft_args(tmp_path, "data.env=babyai"), "unknown config key 'data.env': it is 'env.id' now"),
        (sft_args(tmp_path, "env.id=nope"), "unknown environment 'nope'"),
        (sft_args(tmp_path, f"data.path={tmp_path / 'ok.jsonl'}", "data.successes_only=true"),
         "no conversation in"),
        (["collect", "--env", "nope", "--policy", "expert", "--out", str(tmp_path / "x.jsonl")],
         "unknown environment 'nope'"),
        (["collect", "--env", "babyai", "--policy", "expert", "--format", "csv", "--out", str(tmp_path / "x.jsonl")],
         "unknown format 'csv'"),
        (["dpo", str(REPO / "configs" / "babyai_dpo.yaml"), "model.path=null",
          f"data.path={write(tmp_path / 'allwon.jsonl', scored, scored)}", f"run.output_dir={tmp_path}"],
         "DPO found no preference pair"),
        (["dpo", str(REPO / "configs" / "babyai_dpo.yaml"), "model.path=null", "optim.micro_batch_size=3"],
         "optim.micro_batch_size must be even"),
        (["rft", str(REPO / "configs" / "babyai_rft.yaml"), "model.path=/no/such/model"],
         "model path '/no/such/model' is not a directory"),
        (["rft", str(REPO / "configs" / "babyai_rft.yaml"), "rft.rounds=0"],
         "config key 'rft.rounds': input should be greater than or equal to 1, got 0"),
    ]
    for args, message in cases:
        code, _, err = cli(*args)
        assert code == 2, (args, err)
        assert message in err, (message, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "babyai_sft").exists()  # every data error came before a run folder was made


@pytest.mark.parametrize("name", ["sft", "dpo", "rft"])
def test_imitation_configs_load_with_their_own_class(name):
    from agentgym_rl.envs import env_ids
    from agentgym_rl.errors import UserError
    from agentgym_rl.config import DPOConfig, RFTConfig, SFTConfig, load_config

    cls = {"sft": SFTConfig, "dpo": DPOConfig, "rft": RFTConfig}[name]
    config = load_config(cls, REPO / "configs" / f"babyai_{name}.yaml")
    assert config.env.id in env_ids()
    assert config.run.name == f"babyai_{name}"
    with pytest.raises(UserError, match="unknown config key 'bogus'"):
        load_config(cls, REPO / "configs" / f"babyai_{name}.yaml", ["bogus=1"])


def test_without_thoughts_cuts_replies_to_their_action_line():
    from agentgym_rl.train.demonstrations import without_thoughts

    demo = Trajectory("babyai", "babyai_1", "GoTo", input_ids=[1, 2], loss_mask=[0, 1], messages=[
        {"role": "user", "content": "Thought: not a reply\nYou see a wall."},
        {"role": "assistant", "content": "Thought: I need to turn.\nAction: turn left"}])
    cut = without_thoughts(demo)
    assert [m["content"] for m in cut.messages] == ["Thought: not a reply\nYou see a wall.", "Action: turn left"]
    assert cut.input_ids == [] and demo.messages[1]["content"].startswith("Thought")  # ids re-encoded later
