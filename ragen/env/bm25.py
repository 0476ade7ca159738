"""A small BM25 index over a list of texts, shared by the text environments (``webshop``, ``search_qa``).

It wraps the `bm25s <https://github.com/xhluca/bm25s>`_ library (pure Python + numpy, no Java) and adds
what the environments need on top of it:

* a fixed tokenizer (lower-cased ``\\w\\w+`` tokens, English stop words removed) for documents and queries;
* deterministic ranking: all documents are scored and sorted by (score desc, index asc), so ties never
  depend on a partial sort;
* only documents that share at least one query term are returned (a Lucene-like "hit"), and an
  empty or all-stop-word query simply returns no hits instead of raising.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import bm25s
import numpy as np


@dataclass(frozen=True)
class Hit:
    """One search hit: the position of the document in the indexed list and its BM25 score."""

    index: int
    score: float


def tokenize(text: str, stopwords: str | None = "english") -> list[str]:
    """The tokens BM25 sees for ``text`` (lower-cased ``\\w\\w+`` words, stop words removed)."""
    if not isinstance(text, str) or not text.strip():
        return []
    tokens = bm25s.tokenize([text], stopwords=stopwords, return_ids=False, show_progress=False)
    return list(tokens[0])


def bm25_scores(bm25, vocab, stopwords: str | None, size: int, query: str) -> np.ndarray:
    """Scores (size,) float64 of a ``bm25s.BM25`` for ``query``'s known terms (``vocab``: a container of the index's
    tokens); zeros when none is known (bm25s rejects unknown tokens). Shared by the in-memory and disk indexes."""
    terms = [t for t in tokenize(query, stopwords) if t in vocab]
    if not terms:
        return np.zeros(size, dtype=np.float64)
    return np.asarray(bm25.get_scores(terms), dtype=np.float64)


class BM25Index:
    """BM25 (Lucene variant, ``k1``/``b`` as usual) over ``texts``; ``search(query, k)`` returns hits."""

    def __init__(self, texts: Sequence[str], k1: float = 1.5, b: float = 0.75, stopwords: str | None = "english"):
        if len(texts) == 0:
            raise ValueError("BM25Index needs at least one document; got an empty corpus")
        self.stopwords = stopwords
        self.size = len(texts)
        corpus_tokens = bm25s.tokenize(list(texts), stopwords=stopwords, return_ids=False, show_progress=False)
        self._vocab = {tok for doc in corpus_tokens for tok in doc}
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index(corpus_tokens, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query``: shape (num_docs,), zeros when no term matches."""
        return bm25_scores(self._bm25, self._vocab, self.stopwords, self.size, query)

    def search(self, query: str, k: int) -> list[Hit]:
        """The top ``k`` documents with a positive score, best first (ties broken by document order)."""
        if k <= 0:
            return []
        scores = self.scores(query)
        order = np.lexsort((np.arange(self.size), -scores))  # last key is primary: score desc, then index
        return [Hit(int(i), float(scores[i])) for i in order[:k] if scores[i] > 0]
