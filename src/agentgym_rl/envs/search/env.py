"""`SearchEnv`: Deep Search, question answering by searching a corpus over several turns, in
the Search-R1 protocol.

Each reply holds one tag (the last one counts, as the last `Action:` line does in the other
environments; a final tag left unclosed counts, for models stopped at the closing tag):

- `<search>query</search>`: the observation is the top-k documents,
  `<information>Doc 1(Title: ...) text\\nDoc 2(Title: ...) text</information>`;
- `<answer>text</answer>`: an exact match with the gold answer after normalisation earns
  reward 1 and ends the episode; a wrong answer is told so and the episode goes on.

A reply with neither tag (or an empty one) is answered with how to reply, flagged
`invalid_action`, and earns nothing. `info` carries the question's category and, after an
answer, its token F1 ("f1").

Item `i` is question `i` of the embedded world (`world.py`): the first `NUM_TEST` are the
test split, the others train. Categories are the hop kinds (`world.CATEGORIES`). With
`qa_dir` and `corpus`, the questions and documents are the user's real ones instead.
"""

from __future__ import annotations

import random
import re
from functools import cache
from pathlib import Path
from typing import Any

from .. import snapshots
from ..base import EnvStateError, StepResult, TextEnv, parse_item_index
from ..tasks import Task
from .answers import exact_match, f1_score
from .data import qa_file, read_qa
from .retrieval import BM25Retriever, Doc, RemoteRetriever, Retriever, bm25_for_corpus, read_corpus
from .world import Question, cached_world

NUM_TEST = 500
MAX_QUERY_CHARS = 300
"""A query is cut to this length (a model may write pages into a tag)."""

INSTRUCTION = (
    "Answer the question by searching an encyclopedia. Each turn, think briefly, then write "
    "exactly one of:\n"
    "<search>a query</search> to get the top documents for the query, or\n"
    "<answer>the answer</answer> when you know it (a short name, place or number).\n"
    "Facts are spread over several articles: search for one entity at a time, then for what "
    "you learnt. Example:\n"
    "<think>I need the birthplace of Ada Lovel.</think>\n<search>Ada Lovel</search>"
)
NO_TAG = "Your reply held no <search>query</search> and no <answer>answer</answer>. Reply with one of them."

_TAG = re.compile(r"<(search|answer)>(.*?)(?:</\1>|$)", re.DOTALL | re.IGNORECASE)


def parse_reply(reply: str) -> tuple[str, str] | None:
    """("search" | "answer", its text) of the reply's last tag, or None when it has none or
    the tag is empty. NULs and lone surrogates are made safe first."""
    reply = reply.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    tags = _TAG.findall(reply)
    if not tags:
        return None
    kind, text = tags[-1]
    text = " ".join(text.split())[:MAX_QUERY_CHARS]
    return (kind.lower(), text) if text else None


def format_documents(docs: list[Doc]) -> str:
    """Search-R1's layout of retrieved documents."""
    if not docs:
        return "<information>No document matches the query.</information>"
    body = "\n".join(f"Doc {i}(Title: {doc.title}) {doc.text}" for i, doc in enumerate(docs, 1))
    return f"<information>{body}</information>"


#: Where BM25 indexes of corpus files are kept (one per file content).
INDEX_CACHE = Path.home() / ".cache" / "agentgym-rl"


@cache
def _remote(url: str) -> RemoteRetriever:
    """One client (a connection pool) per server, shared by the envs of a process."""
    return RemoteRetriever(url)


#: Where the documents come from: a corpus file, or the generated world of (size, seed).
Source = str | tuple[int, int]


@cache
def _docs(corpus: Source) -> tuple[Doc, ...]:
    if isinstance(corpus, tuple):
        return tuple(Doc(a.id, a.title, a.text) for a in cached_world(*corpus).articles)
    if not Path(corpus).is_file():
        raise ValueError(f"no corpus file {corpus!r}")
    return tuple(read_corpus(corpus))


@cache
def _bm25(corpus: Source) -> BM25Retriever:
    """The BM25 index of a corpus file or generated world, built once per process and shared
    by its envs; a file's index is also kept on disk."""
    if isinstance(corpus, tuple):
        return BM25Retriever(_docs(corpus))
    return bm25_for_corpus(corpus, INDEX_CACHE, _docs(corpus))


@cache
def _dense(corpus: Source, encoder: str) -> Retriever:
    """The dense index of a corpus for an encoder, built once per process."""
    from .dense import DenseRetriever, HashingEncoder, HFEncoder

    if encoder != "hashing" and not Path(encoder).is_dir():
        raise ValueError(f"encoder must be 'hashing' or a local Hugging Face encoder folder; no folder {encoder!r}")
    model = HashingEncoder() if encoder == "hashing" else HFEncoder(encoder)
    return DenseRetriever(_docs(corpus), model)


def local_retriever(source: Source, retriever: str = "bm25", encoder: str = "hashing") -> Retriever:
    """The retriever over a corpus file or generated world (size, seed): "bm25" or "dense"
    with `encoder`; built once per process."""
    if retriever not in ("bm25", "dense"):
        raise ValueError(f"retriever must be 'bm25' or 'dense', got {retriever!r}")
    return _dense(source, encoder) if retriever == "dense" else _bm25(source)


@cache
def _questions(qa_dir: str | None, world: tuple[int, int]) -> tuple[tuple[Question, ...], int]:
    """(the questions, test ones first, then train; how many are test): the real ones of
    `qa_dir`, else those of the generated world of (size, seed)."""
    if qa_dir is None:
        return tuple(cached_world(*world).questions), NUM_TEST
    splits = [read_qa(qa_file(qa_dir, split)) for split in ("test", "train")]
    questions = tuple(Question(item.question, item.answers[0], item.source, (), item.answers)
                      for split in splits for item in split)
    return questions, len(splits[0])


def search_tasks(split: str, qa_dir: str | None = None, world_size: int = 1000, world_seed: int = 0) -> list[Task]:
    questions, num_test = _questions(qa_dir, (world_size, world_seed))
    indices = range(num_test) if split == "test" else range(num_test, len(questions))
    return [Task("search", i, questions[i].category) for i in indices]


class SearchEnv(TextEnv):
    """Deep Search (see the module docstring).

    Args:
        top_k: documents returned per search (Search-R1 uses 3).
        retriever: "bm25" (`bm25s`) or "dense" (FAISS over `encoder`'s vectors).
        encoder: the dense retriever's encoder: "hashing" (no weights) or a local Hugging Face
            encoder folder (e5, bge, ...; see `dense.HFEncoder`).
        retriever_url: a retrieval server with Search-R1's API (`agentgym-rl serve-retriever`)
            to search instead of an index in this process; a search it cannot answer raises
            `RetrievalError`, which ends that episode as a recorded failure.
        corpus: a JSONL corpus file in wiki-18's layout to search instead of the embedded
            encyclopedia (its BM25 index is kept in `INDEX_CACHE`).
        qa_dir: a directory of real QA files (`data.py`: `train` and `test`, parquet or JSONL,
            FlashRAG's or Search-R1's layout) to ask instead of the embedded questions; needs
            `corpus` or `retriever_url`. Categories are the rows' datasets; there is no expert.
        world_size, world_seed: the generated encyclopedia (`world.build_world`: people in it,
            and the seed); other values give other articles and questions.
    """

    env_id = "search"
    instruction = INSTRUCTION

    def __init__(self, top_k: int = 3, retriever: str = "bm25", encoder: str = "hashing",
                 retriever_url: str | None = None, corpus: str | None = None, qa_dir: str | None = None,
                 world_size: int = 1000, world_seed: int = 0) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if qa_dir and not (corpus or retriever_url):
            raise ValueError("real questions (qa_dir) need their documents: give corpus or retriever_url")
        if corpus and not qa_dir:
            raise ValueError("a corpus needs its questions: give qa_dir too")
        self.top_k = top_k
        world = (world_size, world_seed)
        self.questions, self.num_test = _questions(qa_dir, world)
        self.retriever = _remote(retriever_url) if retriever_url else local_retriever(corpus or world, retriever,
                                                                                        encoder)
        self.question: Question | None = None
        self._done = True
        self._info: dict[str, Any] = {}
        self.found: list[list[Doc]] = []  # the documents of each search this episode (the expert reads them)

    def reset(self, item_id: int | str | None = None, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        questions = self.questions
        if item_id is None:
            index = random.Random(seed).randrange(self.num_test, len(questions))
        else:
            index = parse_item_index(item_id, self.env_id)
            if index >= len(questions):
                raise ValueError(f"item {index} is past the last of {len(questions)} search questions")
        self.question = questions[index]
        self.found, self._done = [], False
        self._info = {"item_id": f"{self.env_id}_{index}", "category": self.question.category}
        return f"Question: {self.question.question}", dict(self._info)

    def step(self, action: str) -> StepResult:
        if self.question is None:
            raise EnvStateError("call reset before step")
        if self._done:
            raise EnvStateError("the episode has ended; call reset")
        parsed = parse_reply(action or "")
        if parsed is None:
            return NO_TAG, 0.0, False, False, {**self._info, "success": False, "invalid_action": True}
        kind, text = parsed
        if kind == "search":
            docs = self.retriever.search([text], self.top_k)[0]
            self.found.append(docs)
            return format_documents(docs), 0.0, False, False, {**self._info, "success": False,
                                                                "invalid_action": False}
        golds = list(self.question.answers or (self.question.answer,))
        correct = exact_match(text, golds)
        info = {**self._info, "success": correct, "invalid_action": False, "f1": f1_score(text, golds)}
        if correct:
            self._done = True
            return f"Your answer {text!r} is correct.", 1.0, True, False, info
        return f"Your answer {text!r} is not correct. Search more, or answer again.", 0.0, False, False, info

    def snapshot(self) -> bytes:
        """The question, the documents each search found, and the episode's info (the retriever
        and its index are the instance's own, built from the same arguments)."""
        if self.question is None:
            raise EnvStateError("call reset before snapshot")
        return snapshots.dump(self.env_id, (self.question, self.found, self._done, dict(self._info)))

    def restore(self, state: bytes) -> None:
        self.question, found, self._done, info = snapshots.load(self.env_id, state)
        self.found, self._info = [list(docs) for docs in found], dict(info)

    def expert_action(self) -> str | None:
        """Follow the question's hops with real searches (`expert.search_expert_reply`); None
        for a real question (no hops are known)."""
        if self.question is None or self._done or not self.question.hops:
            return None
        from .expert import search_expert_reply

        return search_expert_reply(self.question, self.found)

    def available_actions(self) -> list[str] | None:
        return None

    def close(self) -> None:
        self._done = True
