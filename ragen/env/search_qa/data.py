"""Loaders for the search_qa env: questions with answer aliases, and a passage corpus.

Questions (JSONL, one record a line, or JSON: a list, or TriviaQA's ``{"Data": [...]}``), per record:
* TriviaQA: ``Question`` and ``Answer`` = ``{Value, Aliases, NormalizedAliases, ...}`` (all are used);
* simple: ``question`` with ``answers`` (list), ``answer`` (str or list) or ``golden_answers`` (list).
An id is taken from ``id`` / ``QuestionId`` / ``qid``, else the record's position.

Corpus (JSONL): ``{id, title, text}`` per line; FlashRAG-style ``{id, contents}`` with the title on the
first line of ``contents`` is accepted too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "search_qa"


@dataclass(frozen=True)
class QAItem:
    """A question and its gold answer aliases (at least one)."""

    qid: str
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Passage:
    """One corpus passage."""

    pid: str
    title: str
    text: str


def _records(path: Path) -> list[Any]:
    if not path.is_file():
        raise FileNotFoundError(f"search_qa data file {str(path)!r} not found; check qa_path / corpus_path")
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("[") or (stripped.startswith("{") and path.suffix == ".json"):
        data = json.loads(text)
        return data.get("Data", data.get("data", [])) if isinstance(data, dict) else data
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _answers(record: dict[str, Any]) -> list[str]:
    answer = record.get("Answer")
    if isinstance(answer, dict):  # TriviaQA
        values = [answer.get("Value")] + list(answer.get("Aliases") or []) + list(answer.get("NormalizedAliases") or [])
    else:
        values = []
        for key in ("answers", "answer", "golden_answers"):
            value = record.get(key)
            values += value if isinstance(value, list) else [value]
    seen, out = set(), []
    for v in values:
        if isinstance(v, str) and v.strip() and v.strip() not in seen:
            seen.add(v.strip())
            out.append(v.strip())
    return out


def load_qa(path: str | Path) -> list[QAItem]:
    """Questions with their aliases from ``path`` (see the module docstring); records without answers are skipped."""
    items = []
    for i, record in enumerate(_records(Path(path).expanduser())):
        if not isinstance(record, dict):
            continue
        question = record.get("question", record.get("Question"))
        answers = _answers(record)
        if isinstance(question, str) and question.strip() and answers:
            qid = str(record.get("id", record.get("QuestionId", record.get("qid", i))))
            items.append(QAItem(qid, question.strip(), tuple(answers)))
    if not items:
        raise ValueError(f"no usable question/answer records in {str(path)!r}")
    return items


def load_corpus(path: str | Path) -> list[Passage]:
    """Passages from a JSONL corpus (``id``/``title``/``text``, or ``id``/``contents``)."""
    passages = []
    for i, record in enumerate(_records(Path(path).expanduser())):
        if not isinstance(record, dict):
            continue
        title, text = record.get("title"), record.get("text")
        if text is None and isinstance(record.get("contents"), str):
            first, _, rest = record["contents"].partition("\n")
            title, text = (title or first.strip('"')), rest
        if isinstance(text, str) and text.strip():
            passages.append(Passage(str(record.get("id", i)), str(title or ""), text.strip()))
    if not passages:
        raise ValueError(f"no passages with text in corpus {str(path)!r}")
    return passages
