"""WebArena's evaluators, as pure functions of what the episode produced.

A task's `eval` names its `eval_types`; the score is the product of each type's score (all must
pass). The browser-dependent part of `program_html` (fetching a page's text) and our
`site_state` check (a query on the site's database) live in the env; the comparisons are here.

- `string_match`: the answer of `stop [...]` against `reference_answers`: `exact_match` (equal
  after cleaning), `must_include` (each phrase appears; " |OR| " separates alternatives),
  `fuzzy_match` (a judge model decides; see `Judge`).
- `url_match`: the last page's URL against `reference_url` (" |OR| " alternatives): the same
  path, and every query parameter of the reference present with the same values.
- `program_html`: page texts against `required_contents` (`exact_match` / `must_include`).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol
from urllib.parse import parse_qs, unquote, urlparse

ALTERNATIVES = " |OR| "


class Judge(Protocol):
    def __call__(self, question: str, answer: str, reference: str) -> bool: ...


def clean_answer(text: str) -> str:
    """Lower case, outer whitespace and quotes removed (WebArena's cleaning)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text.strip().lower()


def must_include(text: str, phrase: str) -> bool:
    """Whether `text` holds `phrase` (or one of its " |OR| " alternatives), case-insensitively."""
    text = clean_answer(text)
    return any(clean_answer(option) in text for option in phrase.split(ALTERNATIVES))


def string_match(answer: str, reference_answers: dict[str, Any], question: str = "",
                 judge: Judge | None = None) -> float:
    exact = {kind: value for kind, value in reference_answers.items() if kind != "fuzzy_match"}
    score = contents_match(answer, exact)
    if "fuzzy_match" in reference_answers:
        if judge is None:
            raise ValueError("this task needs a judge model for fuzzy_match (set judge_url)")
        reference = reference_answers["fuzzy_match"]
        references = reference if isinstance(reference, list) else [reference]
        score *= float(all(judge(question, answer, str(item)) for item in references))
    return score


def _normalise(url: str) -> tuple[str, dict[str, list[str]]]:
    parts = urlparse(unquote(url))
    return parts.path.rstrip("/") or "/", parse_qs(parts.query)


def url_match(url: str, reference_url: str) -> float:
    path, query = _normalise(url)
    for option in reference_url.split(ALTERNATIVES):
        reference_path, reference_query = _normalise(option)
        if path == reference_path and all(
                [value.lower() for value in query.get(key, [])] == [v.lower() for v in values]
                for key, values in reference_query.items()):
            return 1.0
    return 0.0


def contents_match(text: str, required: dict[str, Any]) -> float:
    """1.0 when `text` meets every `exact_match` / `must_include` of `required` (a string
    answer's `reference_answers`, or a `program_html` target's `required_contents`), else 0.0."""
    score = 1.0
    for kind, reference in required.items():
        if kind == "exact_match":
            score *= float(clean_answer(text) == clean_answer(str(reference)))
        elif kind == "must_include":
            score *= float(all(must_include(text, str(phrase)) for phrase in reference))
        else:
            raise ValueError(f"unknown match kind {kind!r}")
    return score


def evaluate(task: dict[str, Any], answer: str, url: str, page_text: Callable[[str, str], str],
             site_rows: Callable[[str, str], list[list[Any]]], judge: Judge | None = None) -> float:
    """The score of an episode that ended with `stop [answer]` on `url`.

    Args:
        page_text: (url or "last", locator JS or "") -> the text the locator selects.
        site_rows: (site name, SQL) -> rows on the episode's copy of that site's database.
    """
    spec = task["eval"]
    score = 1.0
    for kind in spec["eval_types"]:
        if kind == "string_match":
            score *= string_match(answer, spec["reference_answers"], task.get("intent", ""), judge)
        elif kind == "url_match":
            score *= url_match(url, spec["reference_url"])
        elif kind == "program_html":
            for target in spec["program_html"]:
                score *= contents_match(page_text(target["url"], target.get("locator", "")), target["required_contents"])
        elif kind == "site_state":
            for check in spec["site_state"]:
                rows = [list(row) for row in site_rows(check["site"], check["sql"])]
                score *= float(rows == check["expected"])
        else:
            raise ValueError(f"unknown eval type {kind!r}")
    return score


def needs_judge(task: dict[str, Any]) -> bool:
    return "fuzzy_match" in (task.get("eval", {}).get("reference_answers") or {})
