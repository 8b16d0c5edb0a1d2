"""Real QA data for Deep Search: FlashRAG's JSONL and Search-R1's parquet layouts, a wiki-18
corpus file, and the env and task lists built from them (fixture files in those layouts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym_rl.envs import registry
from agentgym_rl.envs.search.data import read_qa
from agentgym_rl.envs.search.env import SearchEnv
from agentgym_rl.errors import UserError

CORPUS = [
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Lyon"\nLyon is a city in France on the Rhone.'},
    {"id": "3", "contents": '"Mont Blanc"\nMont Blanc is the highest mountain of the Alps, 4,806 metres high.'},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def flashrag(tmp_path, monkeypatch):
    """A FlashRAG-layout dataset directory `nq/` and a corpus file (its index cached under tmp_path)."""
    monkeypatch.setattr("agentgym_rl.envs.search.env.INDEX_CACHE", tmp_path / "index-cache")
    (tmp_path / "nq").mkdir()
    write_jsonl(tmp_path / "nq" / "test.jsonl", [
        {"id": "test_0", "question": "what is the capital of france", "golden_answers": ["Paris", "Paris, France"]},
        {"id": "test_1", "question": "how high is mont blanc", "golden_answers": ["4,806 metres"]}])
    write_jsonl(tmp_path / "nq" / "train.jsonl", [
        {"id": "train_0", "question": "which river runs through lyon", "golden_answers": ["Rhone"]}])
    write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    return {"qa_dir": str(tmp_path / "nq"), "corpus": str(tmp_path / "corpus.jsonl")}


def test_search_r1_parquet_rows_are_read_from_their_prompt_and_ground_truth(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as parquet

    rows = [{"data_source": "hotpotqa", "ability": "fact-reasoning",
             "prompt": [{"role": "user", "content": "Answer the given question. ... Question: who founded lyon?"}],
             "reward_model": {"style": "rule", "ground_truth": {"target": ["Lucius Munatius Plancus"]}},
             "extra_info": {"split": "test", "index": 0}}]
    parquet.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    [item] = read_qa(str(tmp_path / "test.parquet"))
    assert (item.question, item.answers, item.source) == ("who founded lyon?", ("Lucius Munatius Plancus",),
                                                          "hotpotqa")


def test_a_row_in_neither_layout_is_named(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", [{"question": "q", "golden_answers": ["a"]}, {"question": "no answers"}])
    with pytest.raises(ValueError, match="row 2"):
        read_qa(str(tmp_path / "test.jsonl"))


def test_real_questions_are_asked_and_every_gold_answer_counts(flashrag):
    tests = registry.tasks("search", "test", flashrag)
    assert [(t.index, t.category) for t in tests] == [(0, "nq"), (1, "nq")]
    assert [t.index for t in registry.tasks("search", "train", flashrag)] == [2]
    env = SearchEnv(top_k=2, **flashrag)
    assert len(list((Path(flashrag["corpus"]).parent / "index-cache").iterdir())) == 1
    observation, info = env.reset(0)
    assert observation == "Question: what is the capital of france" and info["category"] == "nq"
    assert env.expert_action() is None  # no hops are known for a real question
    documents, *_ = env.step("<search>capital of France</search>")
    assert documents.startswith('<information>Doc 1(Title: "Paris") Paris is the capital')
    *_, info = env.step("<answer>Paris France</answer>")  # the second gold answer, normalised
    assert info["success"] and info["f1"] == 1.0
    env.reset(1)
    *_, info = env.step("<answer>4806 metres</answer>")  # "4,806" normalises to "4806"
    assert info["success"]


def test_real_data_settings_are_checked(flashrag, tmp_path):
    with pytest.raises(ValueError, match="need their documents"):
        SearchEnv(qa_dir=flashrag["qa_dir"])
    with pytest.raises(ValueError, match="needs its questions"):
        SearchEnv(corpus=flashrag["corpus"])
    with pytest.raises(ValueError, match="no corpus file"):
        SearchEnv(qa_dir=flashrag["qa_dir"], corpus=str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="no test.parquet or test.jsonl"):
        registry.tasks("search", "test", {"qa_dir": str(tmp_path)})
    with pytest.raises(UserError, match="bad arguments for environment .search.: real questions"):
        registry.env_factory("search", {"qa_dir": flashrag["qa_dir"]})
