"""Real QA data for Deep Search, in the layouts Search-R1 uses (none can be downloaded here:
users point `qa_dir` at their copies).

A QA directory holds `train` and `test` files, each `.parquet` or `.jsonl`, with one question
per row in either layout:

- FlashRAG's (what Search-R1 downloads): `{"id", "question", "golden_answers": [...]}`;
- Search-R1's processed rows: `{"data_source": "nq", "prompt": [...], "reward_model":
  {"ground_truth": {"target": [...]}}, ...}`, the question also kept as `question` (else it is
  read from the prompt, after its last "Question:").

A row's `data_source` (nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle) is
its category; without one, the directory's name is (FlashRAG keeps each dataset in its own,
e.g. `nq/test.jsonl`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class QAItem:
    question: str
    answers: tuple[str, ...]
    source: str


def _question(row: dict[str, Any]) -> str:
    if row.get("question"):
        return str(row["question"]).strip()
    prompt = row["prompt"]
    text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    return text.rsplit("Question:", 1)[-1].strip()


def _answers(row: dict[str, Any]) -> tuple[str, ...]:
    if "golden_answers" in row:
        answers = row["golden_answers"]
    else:
        answers = row["reward_model"]["ground_truth"]["target"]
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise ValueError("no answer")
    return tuple(str(answer) for answer in answers)


def _rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as parquet
        except ModuleNotFoundError:
            raise ModuleNotFoundError("parquet QA files need `pyarrow`: pip install 'agentgym-rl[search]'") from None
        return parquet.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


@cache
def read_qa(path: str) -> tuple[QAItem, ...]:
    """The questions of one QA file; a row in neither layout raises ValueError naming it."""
    items = []
    for number, row in enumerate(_rows(Path(path)), 1):
        try:
            items.append(QAItem(_question(row), _answers(row), str(row.get("data_source") or Path(path).parent.name)))
        except (KeyError, TypeError, IndexError, ValueError) as error:
            raise ValueError(f"{path}, row {number}: not a QA row with a question and answers ({error!r})") from None
    return tuple(items)


def qa_file(qa_dir: str, split: str) -> str:
    """The `split` file of a QA directory (`.parquet` first, then `.jsonl`)."""
    for suffix in (".parquet", ".jsonl"):
        path = Path(qa_dir) / f"{split}{suffix}"
        if path.is_file():
            return str(path)
    raise ValueError(f"no {split}.parquet or {split}.jsonl in QA directory {qa_dir!r}")
