"""Dense retrieval: queries and documents embedded by an `Encoder`, nearest documents by inner
product in an exact FAISS index (`IndexFlatIP`). Vectors are L2-normalised, so the score is
the cosine similarity.

Encoders:
- `HFEncoder`: a Hugging Face encoder from a local folder (e5, as Search-R1 uses, bge, or any
  `AutoModel`), mean- or CLS-pooled, with e5's "query: " / "passage: " prefixes by default;
- `HashingEncoder`: words hashed into signed buckets, needing no weights (tests, and a
  baseline that shows what a learnt encoder adds).
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any, Literal, Protocol, Sequence

import numpy as np

from .retrieval import Doc

Kind = Literal["query", "passage"]


class Encoder(Protocol):
    dim: int

    def encode(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        """Unit vectors, float32, shape (len(texts), dim)."""
        ...


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


class HashingEncoder:
    """Each lower-cased word adds ±1 to one of `dim` buckets, both chosen by its hash."""

    def __init__(self, dim: int = 4096):
        self.dim = dim

    def encode(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                vectors[row, digest % self.dim] += 1.0 if digest >> 63 else -1.0
        return _unit(vectors)


class HFEncoder:
    """A Hugging Face encoder loaded from a local folder (nothing is downloaded).

    Args:
        path: the folder (model and tokenizer).
        pooling: "mean" over the attention mask (e5) or "cls" (bge).
        query_prefix, passage_prefix: prepended to queries and documents (e5's by default;
            "" for encoders trained without).
        max_length: tokens per text; batch_size: texts per forward pass.
    """

    def __init__(self, path: str, pooling: Literal["mean", "cls"] = "mean", query_prefix: str = "query: ",
                 passage_prefix: str = "passage: ", max_length: int = 256, batch_size: int = 64,
                 device: str = "cpu"):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()
        self.pooling, self.device = pooling, device
        self.prefixes = {"query": query_prefix, "passage": passage_prefix}
        self.max_length, self.batch_size = max_length, batch_size
        self.dim = int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], kind: Kind) -> np.ndarray:
        torch = self._torch
        out = []
        for start in range(0, len(texts), self.batch_size):
            batch = [self.prefixes[kind] + text for text in texts[start:start + self.batch_size]]
            inputs = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length,
                                    return_tensors="pt").to(self.device)
            with torch.no_grad():
                hidden = self.model(**inputs).last_hidden_state  # (batch, tokens, dim)
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (batch, tokens, 1)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            out.append(pooled.float().cpu().numpy())
        return _unit(np.concatenate(out)) if out else np.zeros((0, self.dim), np.float32)


class DenseRetriever:
    """Exact nearest-neighbour retrieval over `docs` embedded by `encoder` (title and text).

    Args:
        index: a FAISS index of `docs`' vectors built before (default: built now).
    """

    def __init__(self, docs: Sequence[Doc], encoder: Encoder, index: Any = None):
        try:
            import faiss
        except ModuleNotFoundError:
            raise ModuleNotFoundError("dense retrieval needs `faiss-cpu`: pip install 'agentgym-rl[search]'") \
                from None
        if not docs:
            raise ValueError("cannot index an empty corpus")
        self.docs, self.encoder = list(docs), encoder
        self.index = index
        if index is None:
            self.index = faiss.IndexFlatIP(encoder.dim)
            self.index.add(encoder.encode([f"{d.title}\n{d.text}" for d in self.docs], "passage"))
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], k: int) -> list[list[Doc]]:
        if not queries:
            return []
        vectors = self.encoder.encode(list(queries), "query")
        with self._lock:
            scores, rows = self.index.search(vectors, min(k, len(self.docs)))
        return [[Doc(self.docs[i].id, self.docs[i].title, self.docs[i].text, float(s))
                 for i, s in zip(row, score) if i >= 0] for row, score in zip(rows, scores)]
