"""Loaders for the search_qa env: questions with answer aliases, and a passage corpus.

Questions (JSONL, one record a line, or JSON: a list, or TriviaQA's ``{"Data": [...]}``), per record:
* TriviaQA: ``Question`` and ``Answer`` = ``{Value, Aliases, NormalizedAliases, ...}`` (all are used);
* simple: ``question`` with ``answers`` (list), ``answer`` (str or list) or ``golden_answers`` (list).
An id is taken from ``id`` / ``QuestionId`` / ``qid``, else the record's position.

Corpus (JSONL): ``{id, title, text}`` per line; FlashRAG-style ``{id, contents}`` with the title on the
first line of ``contents`` is accepted too. A corpus too big for memory is served from a disk index folder
(``PassageStore`` + ``ragen.env.bm25_disk.DiskBM25Index``, built by ``python -m ragen_external.search.build``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen.env.bm25_disk import JsonlStore

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "search_qa"
PASSAGES_FILE = "passages.jsonl"  # the record store inside a disk index folder


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


def parse_passage(record: Any, position: int) -> Passage | None:
    """One corpus record (``id``/``title``/``text`` or ``id``/``contents``) as a Passage; None without text."""
    if not isinstance(record, dict):
        return None
    title, text = record.get("title"), record.get("text")
    if text is None and isinstance(record.get("contents"), str):
        first, _, rest = record["contents"].partition("\n")
        title, text = (title or first.strip('"')), rest
    if isinstance(text, str) and text.strip():
        return Passage(str(record.get("id", position)), str(title or ""), text.strip())
    return None


def load_corpus(path: str | Path) -> list[Passage]:
    """Passages from a JSONL corpus (``id``/``title``/``text``, or ``id``/``contents``)."""
    records = _records(Path(path).expanduser())
    passages = [p for i, r in enumerate(records) if (p := parse_passage(r, i)) is not None]
    if not passages:
        raise ValueError(f"no passages with text in corpus {str(path)!r}")
    return passages


class PassageStore(Sequence):
    """The passages of a disk index folder (``passages.jsonl``, written by ``ragen_external.search.build``), read
    one line at a time through its offsets file, so a Wikipedia-size corpus is never loaded whole."""

    def __init__(self, index_dir: str | Path):
        self.records = JsonlStore(Path(index_dir).expanduser() / PASSAGES_FILE)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):  # noqa: ANN001 - int or slice
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        r = self.records[i]
        return Passage(r["id"], r["title"], r["text"])

    def __iter__(self) -> Iterator[Passage]:
        return (Passage(r["id"], r["title"], r["text"]) for r in self.records)
