"""The shared BM25 wrapper (ragen/env/bm25.py) against a hand-written Lucene BM25 reference."""

import math

import pytest

from ragen.env.bm25 import BM25Index, tokenize

DOCS = ["the cat sat on the mat", "a dog chased the cat cat", "dogs and birds", "an empty story"]


def lucene_bm25(query: list[str], docs: list[list[str]], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """idf = ln(1 + (N - df + 0.5) / (df + 0.5)); tf part = tf / (tf + k1 * (1 - b + b * |d| / avgdl))."""
    n, avgdl = len(docs), sum(map(len, docs)) / len(docs)
    scores = []
    for doc in docs:
        total = 0.0
        for term in set(query):
            df = sum(term in d for d in docs)
            tf = doc.count(term)
            if df and tf:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                total += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        scores.append(total)
    return scores


def test_tokenizer_drops_stopwords_and_short_tokens():
    assert tokenize("The Cat, a dog & X!") == ["cat", "dog"]
    assert tokenize("") == [] and tokenize(None) == []


def test_scores_match_reference_and_ranking():
    index = BM25Index(DOCS)
    tokenized = [tokenize(d) for d in DOCS]
    for query in ("cat", "dog cat", "birds story"):
        assert index.scores(query).tolist() == pytest.approx(lucene_bm25(tokenize(query), tokenized), rel=1e-5)
    hits = index.search("cat", k=10)
    assert [h.index for h in hits] == [1, 0]  # tf 2 beats tf 1; docs without "cat" are not hits
    assert index.search("cat", k=1)[0].index == 1


def test_ties_broken_by_document_order_and_empty_queries():
    index = BM25Index(["red apple", "red apple", "green pear"])
    assert [h.index for h in index.search("red", k=5)] == [0, 1]
    assert index.search("zebra", 5) == [] and index.search("the", 5) == [] and index.search("red", 0) == []
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Index([])
