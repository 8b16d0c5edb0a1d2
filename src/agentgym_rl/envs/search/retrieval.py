"""Retrievers behind one small interface: `search(queries, k)` -> the top-k documents of each.

- `BM25Retriever` indexes documents with `bm25s` (a sparse-matrix BM25); `bm25_for_corpus`
  builds one over a corpus file once and keeps the index on disk, keyed by the file's hash.
- `RemoteRetriever` asks a server speaking Search-R1's retrieval API (`POST /retrieve`), such
  as `agentgym-rl serve-retriever` or Search-R1's own.

Corpora are JSONL in wiki-18's layout, one `{"id", "contents": "title\ntext"}` per line.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from ..base import EnvStateError
from ..remote import RemoteEnvError, ServerConnection


@dataclass(frozen=True)
class Doc:
    """A retrieved document: its corpus id, title, text and retrieval score."""

    id: str
    title: str
    text: str
    score: float = 0.0


def doc_from_row(row: dict[str, Any]) -> Doc:
    """A corpus row `{"id", "contents": "title\ntext"}` (a "score" is kept when present)."""
    title, _, text = str(row["contents"]).partition("\n")
    return Doc(str(row["id"]), title, text, float(row.get("score", 0.0)))


def row_of(doc: Doc) -> dict[str, str]:
    return {"id": doc.id, "contents": f"{doc.title}\n{doc.text}"}


def read_corpus(path: str | Path) -> list[Doc]:
    """The documents of a JSONL corpus; a bad line raises ValueError naming it."""
    docs = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                docs.append(doc_from_row(json.loads(line)))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}, line {number}: not a corpus row {{\"id\", \"contents\"}} ({error})") from None
    return docs


def write_corpus(docs: Iterable[Doc], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for doc in docs:
            out.write(json.dumps(row_of(doc), ensure_ascii=False) + "\n")


class Retriever(Protocol):
    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        """The `k` best documents for each query, best first."""
        ...


class BM25Retriever:
    """Lexical retrieval over `docs` with `bm25s` (English stopwords removed, no stemming:
    names must match as written).

    Args:
        docs: the corpus; a document's title is indexed with its text, as in wiki-18, whose
            rows hold "title\\ntext".
        index: a `bm25s.BM25` index of `docs` built before (default: built now).
    """

    def __init__(self, docs: Sequence[Doc], index: Any = None):
        try:
            import bm25s
        except ModuleNotFoundError:
            raise ModuleNotFoundError("BM25 retrieval needs the `bm25s` package: pip install 'agentgym-rl[search]'") \
                from None

        if not docs:
            raise ValueError("cannot index an empty corpus")
        self._bm25s = bm25s
        self.docs = list(docs)
        self._index = index
        if index is None:
            self._index = bm25s.BM25()
            self._index.index(self._tokenize([f"{d.title}\n{d.text}" for d in self.docs]), show_progress=False)
        self._lock = threading.Lock()  # retrieval from several env threads at once

    def _tokenize(self, texts: list[str], ids: bool = True):
        return self._bm25s.tokenize(texts, stopwords="en", return_ids=ids, show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        found: list[list[Doc]] = []
        for tokens in self._tokenize(list(queries), ids=False):
            with self._lock:
                scores = self._index.get_scores(tokens) if tokens else np.zeros(0)
            # The top k among the documents that share a word with the query. (bm25s' own
            # selection, `argpartition` over every score, took 8 ms a query on 100k documents,
            # most of them tied at 0; the matching ones are a few hundred.)
            matching = np.flatnonzero(scores)
            best = matching[np.argsort(-scores[matching], kind="stable")[:k]]
            found.append([Doc(d.id, d.title, d.text, float(scores[i])) for i, d in ((int(i), self.docs[int(i)])
                                                                                     for i in best)])
        return found


def bm25_for_corpus(path: str | Path, cache_dir: str | Path, docs: Sequence[Doc] | None = None) -> BM25Retriever:
    """A BM25 retriever over the corpus file at `path` (whose documents, `docs`, the caller
    may have read already), its index built once and kept in `cache_dir/<sha256 of the
    file>/` (a changed file gets a new index)."""
    import bm25s

    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:32]
    saved = Path(cache_dir) / f"bm25-{digest}"
    docs = read_corpus(path) if docs is None else docs
    if saved.is_dir():
        return BM25Retriever(docs, index=bm25s.BM25.load(str(saved)))
    built = BM25Retriever(docs)
    partial = saved.with_name(saved.name + ".partial")  # a crash mid-save leaves no index that looks whole
    built._index.save(str(partial))
    partial.rename(saved)
    return built


class RemoteRetriever:
    """A client of a retrieval server speaking Search-R1's API:
    `POST /retrieve {"queries": [...], "topk": k, "return_scores": true}` answered with
    `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`.

    Args:
        url: the server, e.g. "http://127.0.0.1:8001".
        timeout: seconds to wait for an answer.
        retries: further attempts of a call that could not reach the server (backoff 0.2 s, doubled).
    """

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 2):
        # The env servers' connection: pooled, with the same retries and backoff.
        self._server = ServerConnection(url, timeout=timeout, retries=retries)
        self.url = self._server.url

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        body = {"queries": list(queries), "topk": k, "return_scores": True}
        try:
            answer = self._server.call("POST", "/retrieve", body)
        except (RemoteEnvError, EnvStateError) as error:
            raise RetrievalError(str(error)) from None
        try:
            found = [[doc_from_row({**hit["document"], "score": hit.get("score", 0.0)}) for hit in hits]
                     for hits in answer["result"]]
        except (ValueError, KeyError, TypeError) as error:
            raise RetrievalError(f"{self.url}/retrieve: malformed answer ({error}): {str(answer)[:200]!r}") from None
        if len(found) != len(queries):
            raise RetrievalError(f"{self.url}/retrieve: {len(found)} result lists for {len(queries)} queries")
        return found

    def close(self) -> None:
        self._server.close()


class RetrievalError(RuntimeError):
    """A retrieval server could not be reached or answered wrongly (the message says which)."""
