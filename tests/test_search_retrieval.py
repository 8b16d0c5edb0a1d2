"""Retrieval for Deep Search: corpus files and their cached BM25 index, the Search-R1 retrieval
API (`serve-retriever`) and its client, and the env searching through it."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from test_server import free_port, serving_app, wait_until_healthy

from agentgym_rl.config import RolloutConfig
from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvExpert
from agentgym_rl.envs.search.env import SearchEnv, _bm25
from agentgym_rl.envs.search.retrieval import (Doc, RemoteRetriever, RetrievalError, bm25_for_corpus,
                                               read_corpus, write_corpus)
from agentgym_rl.rollout.engine import RolloutEngine
from agentgym_rl.server.retriever import create_retriever_app

QUERIES = ["Vapax Nopax", "Who wrote The Last Forest of Mirdra?", "the of"]


@pytest.fixture(scope="module")
def retriever_url():
    local = _bm25((1000, 0))
    with serving_app(create_retriever_app(local, len(local.docs))) as url:
        yield url


def test_a_corpus_file_round_trips_and_its_index_is_built_once(tmp_path):
    docs = [Doc("a", '"Vapax Nopax"', "Vapax Nopax was born in Tygor."), Doc("b", "Tygor", "A city.\nIn Kelmark.")]
    write_corpus(docs, tmp_path / "corpus.jsonl")
    assert json.loads((tmp_path / "corpus.jsonl").read_text().splitlines()[1]) == \
        {"id": "b", "contents": "Tygor\nA city.\nIn Kelmark."}
    assert read_corpus(tmp_path / "corpus.jsonl") == docs
    built = bm25_for_corpus(tmp_path / "corpus.jsonl", tmp_path / "cache")
    [index_dir] = list((tmp_path / "cache").iterdir())
    loaded = bm25_for_corpus(tmp_path / "corpus.jsonl", tmp_path / "cache")
    assert loaded.search(["born in Tygor"], 2) == built.search(["born in Tygor"], 2)
    assert list((tmp_path / "cache").iterdir()) == [index_dir]  # the second call built nothing
    (tmp_path / "corpus.jsonl").write_text('{"id": "x", "contents": "X\\nchanged"}\n{"id": "y"}\n')
    with pytest.raises(ValueError, match="line 2"):
        bm25_for_corpus(tmp_path / "corpus.jsonl", tmp_path / "cache")


def test_the_remote_retriever_finds_what_the_local_index_finds(retriever_url):
    local = _bm25((1000, 0))
    remote = RemoteRetriever(retriever_url)
    for mine, theirs in zip(local.search(QUERIES, 3), remote.search(QUERIES, 3)):
        assert [(d.id, d.title, d.text) for d in theirs] == [(d.id, d.title, d.text) for d in mine]
        assert [d.score for d in theirs] == pytest.approx([d.score for d in mine])
    plain = httpx.post(f"{retriever_url}/retrieve", json={"queries": ["Vapax Nopax"], "topk": 1}).json()
    assert set(plain["result"][0][0]) == {"id", "contents"}  # without scores, the bare rows
    assert httpx.get(f"{retriever_url}/status").json()["documents"] == len(local.docs)


@pytest.mark.parametrize("body, reason", [
    ({}, "queries"), ({"queries": []}, "queries"), ({"queries": ["x"], "topk": 0}, "topk"),
    ({"queries": ["x"], "topk": 1000}, "topk"), ({"queries": "x"}, "queries"), ({"queries": ["x" * 3000]}, "over 2000"),
])
def test_a_malformed_retrieval_request_gets_422_with_the_reason(retriever_url, body, reason):
    response = httpx.post(f"{retriever_url}/retrieve", json=body)
    assert response.status_code == 422 and reason in response.text


def test_the_env_plays_alike_through_a_retrieval_server(retriever_url):
    tasks = registry.tasks("search", "test")[:15]
    with RolloutEngine(registry.env_factory("search"), RolloutConfig()) as engine:
        local = engine.run(tasks, EnvExpert(), 10)
    with RolloutEngine(registry.env_factory("search", {"retriever_url": retriever_url}), RolloutConfig()) as engine:
        remote = engine.run(tasks, EnvExpert(), 10)
    assert [t.messages for t in remote] == [t.messages for t in local] and all(t.success for t in remote)


def test_an_unreachable_retrieval_server_fails_the_episode_not_the_run():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RetrievalError, match="cannot connect"):
        RemoteRetriever(url, retries=0).search(["x"], 3)
    with RolloutEngine(registry.env_factory("search", {"retriever_url": url}), RolloutConfig()) as engine:
        [episode] = engine.run(registry.tasks("search", "test")[:1], EnvExpert(), 10)
    assert "RetrievalError" in episode.error and "cannot connect" in episode.error and episode.turns == 0


def test_serve_retriever_serves_a_corpus_file_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # its index goes to ~/.cache
    write_corpus([Doc(str(i), f"Title {i}", f"Text about item{i}.") for i in range(50)], tmp_path / "c.jsonl")
    port = free_port()
    command = [sys.executable, "-m", "agentgym_rl.cli", "serve-retriever", "--corpus", str(tmp_path / "c.jsonl"),
               "--port", str(port), "--token", "t0k"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server)  # /health needs no token, and says only that it is alive
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert httpx.post(f"{url}/retrieve", json={"queries": ["item7"]}).status_code == 401
        monkeypatch.setenv("AGENTGYM_RL_ENV_TOKEN", "t0k")  # what the search env's client sends
        [[doc]] = RemoteRetriever(url).search(["item7"], 1)
        assert (doc.id, doc.title) == ("7", "Title 7")
    finally:
        server.terminate()
        server.wait(10)
    missing = subprocess.run([sys.executable, "-m", "agentgym_rl.cli", "serve-retriever", "--corpus",
                              str(tmp_path / "none.jsonl")], capture_output=True, text=True)
    assert missing.returncode == 2 and "no corpus file" in missing.stderr and "Traceback" not in missing.stderr
    wrong = subprocess.run([sys.executable, "-m", "agentgym_rl.cli", "serve-retriever", "--retriever", "magic"],
                           capture_output=True, text=True)
    assert wrong.returncode == 2 and "retriever must be 'bm25' or 'dense'" in wrong.stderr


def test_dense_retrieval_with_the_hashing_encoder_finds_named_articles():
    """The weight-free encoder: the first subject's article is among the top 3 for its name, and
    the expert answers through it (less surely than through BM25: its buckets are shared by
    unrelated words, 98.8% of the test split when measured)."""
    from agentgym_rl.envs.search.dense import HashingEncoder

    vectors = HashingEncoder(64).encode(["Vapax Nopax", "vapax  NOPAX!", "Tygor"], "query")
    assert vectors.shape == (3, 64) and np.allclose(np.linalg.norm(vectors, axis=1), 1)
    assert np.allclose(vectors[0], vectors[1]) and not np.allclose(vectors[0], vectors[2])
    env = SearchEnv(retriever="dense")
    for question in env.questions[:50]:
        subject = question.hops[0][0]
        assert subject in [d.title for d in env.retriever.search([subject], 3)[0]]
    with RolloutEngine(registry.env_factory("search", {"retriever": "dense"}), RolloutConfig()) as engine:
        episodes = engine.run(registry.tasks("search", "test")[:100], EnvExpert(), 10)
    assert sum(t.success for t in episodes) >= 95 and all(t.error is None for t in episodes)
    with pytest.raises(ValueError, match="no folder"):
        SearchEnv(retriever="dense", encoder="/no/such/encoder")


def test_a_hugging_face_encoder_from_a_local_folder(tmp_path):
    """A tiny BERT with random weights, saved and loaded offline: unit vectors of its width,
    the same text the same vector, and e5's prefixes telling queries from passages."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from agentgym_rl.envs.search.dense import DenseRetriever, HFEncoder

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "query", "passage", ":", "vapax", "nopax", "tygor"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path)
    encoder = HFEncoder(str(tmp_path), batch_size=2)
    queries = encoder.encode(["vapax nopax", "tygor", "vapax nopax"], "query")
    assert queries.shape == (3, 16) and np.allclose(np.linalg.norm(queries, axis=1), 1, atol=1e-5)
    assert np.allclose(queries[0], queries[2]) and not np.allclose(queries[0], queries[1])
    assert not np.allclose(queries[0], encoder.encode(["vapax nopax"], "passage")[0])
    docs = [Doc("0", "vapax", "nopax"), Doc("1", "tygor", "tygor")]
    [[best, second]] = DenseRetriever(docs, encoder).search(["vapax nopax"], 2)
    assert best.score >= second.score and {best.id, second.id} == {"0", "1"}
    with pytest.raises(ValueError):
        HFEncoder(str(tmp_path), pooling="max")
