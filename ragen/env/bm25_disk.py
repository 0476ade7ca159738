"""Disk-backed BM25 index and JSONL record store, read memory-mapped (for corpora too big for ``BM25Index``).

An index folder (written by ``ragen_external.search.index.build_index``) holds:

* bm25s's own files (``data/indices/indptr.csc.index.npy``, ``vocab.index.json``, ``params.index.json``): the
  precomputed per-(token, document) BM25 scores as a CSC matrix, loaded with ``bm25s.BM25.load(mmap=True)`` so a
  query reads only the posting lists of its terms;
* ``ragen_index.json``: the manifest (format name and version, number of documents, k1, b, stop words);
* optionally a record store: ``<name>.jsonl`` (one JSON record a line) with ``<name>.offsets.npy`` (the byte
  offset of each line, int64, plus the file size at the end), read one line at a time.

``DiskBM25Index`` has the semantics of ``ragen.env.bm25.BM25Index`` (same tokenizer and Lucene BM25, hits are the
documents sharing a query term, ties broken by document order), so an environment can use either.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from ragen.env.bm25 import Hit, bm25_scores

MANIFEST = "ragen_index.json"
FORMAT = "ragen-bm25-disk"
FORMAT_VERSION = 1


def read_manifest(path: str | Path, key: str = "index_path") -> dict[str, Any]:
    """The manifest of the index folder ``path``; ValueError naming the config ``key`` when it is missing/bad."""
    root = Path(path).expanduser()
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(
            f"{key}={str(path)!r} is not a disk BM25 index (no {MANIFEST} in it); build one with "
            "`python -m ragen_external.search.build` (or ragen_external.webshop.convert for WebShop)"
        )
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{key}={str(path)!r}: {MANIFEST} says format {manifest.get('format')!r} version "
            f"{manifest.get('version')!r}; expected {FORMAT!r} version {FORMAT_VERSION}: rebuild the index"
        )
    return manifest


class DiskBM25Index:
    """A memory-mapped BM25 index folder; ``search(query, k)`` returns ``Hit``s like ``BM25Index``."""

    def __init__(self, path: str | Path, key: str = "index_path"):
        self.path = Path(path).expanduser()
        self.manifest = read_manifest(self.path, key)
        self.stopwords = self.manifest.get("stopwords", "english")
        self._bm25 = bm25s.BM25.load(str(self.path), mmap=True, show_progress=False)
        self.size = int(self.manifest["num_docs"])
        self._vocab = self._bm25.vocab_dict

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query``: shape (num_docs,), zeros when no term matches."""
        return bm25_scores(self._bm25, self._vocab, self.stopwords, self.size, query)

    def search(self, query: str, k: int) -> list[Hit]:
        """The top ``k`` documents with a positive score, best first (ties broken by document order).

        Exact and O(num_docs): the k-th best score is found by partition, then only the documents scoring at
        least that much are sorted (so equal scores at the cut are ordered by index, as in ``BM25Index``)."""
        if k <= 0:
            return []
        scores = self.scores(query)
        positive = np.flatnonzero(scores > 0)
        if positive.size > k:
            kth = np.partition(scores[positive], positive.size - k)[positive.size - k]
            positive = positive[scores[positive] >= kth]
        order = positive[np.lexsort((positive, -scores[positive]))]
        return [Hit(int(i), float(scores[i])) for i in order[:k]]


class JsonlStore(Sequence):
    """Random access to the records of ``<stem>.jsonl`` through ``<stem>.offsets.npy`` (mmap); recent reads cached.

    Safe to share between threads (the envs of a batch step concurrently, ``agent.env_workers``, and share one store):
    the file's seek + read runs under a lock, so a record is never read from another thread's position."""

    def __init__(self, jsonl_path: str | Path, cache_size: int = 4096):
        self.path = Path(jsonl_path).expanduser()
        offsets_path = self.path.with_suffix(".offsets.npy")
        if not self.path.is_file() or not offsets_path.is_file():
            raise FileNotFoundError(f"record store {str(self.path)!r} (with {offsets_path.name}) not found")
        self.offsets = np.load(offsets_path, mmap_mode="r")
        self._file = None
        self._lock = threading.Lock()
        self._read = functools.lru_cache(maxsize=cache_size)(self._read_uncached)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _read_uncached(self, i: int) -> Any:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        with self._lock:
            if self._file is None:
                self._file = self.path.open("rb")
            self._file.seek(start)
            line = self._file.read(end - start)
        return json.loads(line)

    def __getitem__(self, i):  # noqa: ANN001 - int or slice, as for any Sequence
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range (store has {n})")
        return self._read(i % n)

    def __iter__(self) -> Iterator[Any]:
        with self.path.open("rb") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    def __getstate__(self) -> dict:  # picklable for Ray: reopen the file lazily on the other side
        return {"path": self.path, "cache_size": self._read.cache_info().maxsize}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["cache_size"])


class JsonlWriter:
    """Writes ``<stem>.jsonl`` and, on ``close``, ``<stem>.offsets.npy`` (the line offsets, for ``JsonlStore``).

    Offsets are kept as one int64 per record (8 bytes each: 9.4 MB for 1.18M records)."""

    def __init__(self, jsonl_path: str | Path):
        self.path = Path(jsonl_path)
        self._file = self.path.open("wb")
        self._offsets: list[np.ndarray] = []
        self._pending: list[int] = []
        self._pos = 0

    def write(self, record: Any) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        self._pending.append(self._pos)
        self._pos += len(line)
        self._file.write(line)
        if len(self._pending) >= 65536:
            self._offsets.append(np.asarray(self._pending, dtype=np.int64))
            self._pending = []

    def close(self) -> int:
        """Finish both files; returns the number of records."""
        self._file.close()
        offsets = np.concatenate([*self._offsets, np.asarray(self._pending + [self._pos], dtype=np.int64)])
        np.save(self.path.with_suffix(".offsets.npy"), offsets)
        return len(offsets) - 1
