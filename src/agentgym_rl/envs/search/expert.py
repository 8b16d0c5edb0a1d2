"""The Deep Search expert: it follows a question's hops with real searches, reading each next
subject from the article the last search returned (never from the world's tables)."""

from __future__ import annotations

import re

from .retrieval import Doc
from .world import Question

#: How each relation reads in its subject's article (the sentences of `world._articles`).
_RELATION = {
    "born": re.compile(r"\(born (\d+)\)"),
    "birthplace": re.compile(r" was born in (.+?)\."),
    "employer": re.compile(r" works for (.+?)\."),
    "country": re.compile(r" is a city in (.+?)\."),
    "capital": re.compile(r"Its capital is (.+?)\."),
    "founder": re.compile(r" was founded in \d+ by (.+?)\."),
    "author": re.compile(r" is a book written by (.+?)\."),
}
_WHAT = {"born": "birth year", "birthplace": "birthplace", "employer": "employer", "country": "country",
         "capital": "capital", "founder": "founder", "author": "author"}


def read_fact(docs: list[Doc], subject: str, relation: str) -> str | None:
    """`relation` of `subject` as its article among `docs` states it; None when the article is
    not among them."""
    for doc in docs:
        if doc.title == subject:
            match = _RELATION[relation].search(doc.text)
            return match.group(1) if match else None
    return None


def search_expert_reply(question: Question, found: list[list[Doc]]) -> str:
    """The next reply: a search for the next subject, or the answer once every hop is read.

    Args:
        question: the episode's question (its first subject(s) are named in the question).
        found: the documents of each search made so far, in order.
    """
    comparison = question.category == "comparison"
    values: list[str] = []
    subject, relation = question.hops[0]
    searches = iter(found)
    for hop, (named, relation) in enumerate(question.hops):
        # A comparison's subjects are both in the question; a chain's next subject is the
        # value just read.
        subject = named if comparison or hop == 0 else values[-1]
        value = next((v for docs in searches if (v := read_fact(docs, subject, relation)) is not None), None)
        if value is None:
            return f"<think>I need the {_WHAT[relation]} of {subject}.</think>\n<search>{subject}</search>"
        values.append(value)
    answer = str(abs(int(values[0]) - int(values[1]))) if comparison else values[-1]
    return f"<think>So the answer is {answer}.</think>\n<answer>{answer}</answer>"
