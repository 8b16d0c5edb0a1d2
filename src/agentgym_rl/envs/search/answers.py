"""Scoring an answer: exact match and token F1 after the standard normalisation (SQuAD's,
which Search-R1 and the QA datasets it evaluates on use)."""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and the articles a/an/the dropped, whitespace collapsed."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str, golds: str | list[str]) -> bool:
    """Whether `prediction` equals one of `golds` after normalisation."""
    golds = [golds] if isinstance(golds, str) else golds
    return any(normalize_answer(prediction) == normalize_answer(gold) for gold in golds)


def f1_score(prediction: str, golds: str | list[str]) -> float:
    """The best token-overlap F1 of `prediction` against `golds` (0 when either is empty)."""
    golds = [golds] if isinstance(golds, str) else golds
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        expected = normalize_answer(gold).split()
        common = sum((Counter(predicted) & Counter(expected)).values())
        if common:
            precision, recall = common / len(predicted), common / len(expected)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
