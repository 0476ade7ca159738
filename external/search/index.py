"""Streaming, chunked construction of a disk BM25 index (the folder ``ragen.env.bm25_disk.DiskBM25Index`` reads).

BM25 (Lucene variant, as bm25s's default and ``ragen.env.bm25``): for term t and document d,
    score(t, d) = idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),   idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))
Both idf and avgdl are corpus-wide, so the index is built in two passes over chunks of ``chunk_size`` documents,
never holding more than one chunk's tokens in memory:

1. tokenise a chunk (``ragen.env.bm25.tokenize``'s tokenizer: bm25s, English stop words), map tokens to global ids
   (the vocabulary grows as new words appear), reduce it to (document, token, tf) triples, sort them by token and
   spill them to temporary ``.npy`` files; accumulate df per token and the document lengths;
2. with N, avgdl and idf known (so indptr = cumsum(df)), write the final CSC arrays sequentially, one block of
   tokens (~``block_nnz`` postings) at a time: the block's postings are one slice of each spilled chunk (binary
   search on its memory-mapped token array); scored and stably sorted by token, they fill ``[indptr[t0],
   indptr[t1])``, documents in order within each token.

The result is exactly what ``bm25s.BM25.index`` + ``save`` would write for the same tokens (float32 scores,
vocabulary with bm25s's trailing empty token), so ``bm25s.BM25.load(dir, mmap=True)`` reads it.
Memory: one chunk's tokens and triples (pass 1) or one block of postings (pass 2, at least one token's), plus
O(documents) float32 lengths, O(vocabulary) arrays and the vocabulary dict itself.
"""

from __future__ import annotations

import json
import mmap
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import bm25s
import numpy as np
from tqdm import tqdm

from ragen.env.bm25_disk import FORMAT, FORMAT_VERSION, MANIFEST

DATA, INDICES, INDPTR = "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"
VOCAB, PARAMS = "vocab.index.json", "params.index.json"


@dataclass(frozen=True)
class BuildStats:
    """What a build produced (for the CLI's summary and the bench)."""

    num_docs: int
    vocab_size: int
    nnz: int
    avgdl: float
    chunks: int


def chunked(items: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of ``size`` items (the last may be shorter)."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def chunk_triples(texts: list[str], vocab: dict[str, int], stopwords: str | None) -> tuple[np.ndarray, ...]:
    """(doc_local, token, tf, doc_len) of one chunk; new tokens are added to ``vocab`` (global ids).

    doc_local/token/tf: (nnz,) int64/int64/float32 sorted by (doc_local, token); doc_len: (len(texts),) int64."""
    tokens = bm25s.tokenize(texts, stopwords=stopwords, return_ids=False, show_progress=False)
    doc_len = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
    flat = np.fromiter((vocab.setdefault(w, len(vocab)) for doc in tokens for w in doc), dtype=np.int64,
                       count=int(doc_len.sum()))
    docs = np.repeat(np.arange(len(texts), dtype=np.int64), doc_len)
    keys, tf = np.unique((docs << 32) | flat, return_counts=True)
    return keys >> 32, keys & 0xFFFFFFFF, tf.astype(np.float32), doc_len


def _grow(array: np.ndarray, size: int) -> np.ndarray:
    if size <= len(array):
        return array
    out = np.zeros(max(size, 2 * len(array)), dtype=array.dtype)
    out[: len(array)] = array
    return out


def _spill(texts: Iterable[str], tmp: Path, chunk_size: int, stopwords: str | None, progress: bool, total: int | None):
    """Pass 1: (vocab, df, doc lengths, number of chunks)."""
    vocab: dict[str, int] = {}
    df = np.zeros(1024, dtype=np.int64)
    lengths: list[np.ndarray] = []
    n_docs, n_chunks = 0, 0
    bar = tqdm(total=total, desc="BM25 pass 1/2: tokenise", unit="doc", disable=not progress)
    for chunk in chunked(texts, chunk_size):
        doc_local, token, tf, doc_len = chunk_triples(chunk, vocab, stopwords)
        df = _grow(df, len(vocab))
        present, n_present = np.unique(token, return_counts=True)  # (doc, token) pairs are unique: counts = df
        df[present] += n_present
        order = np.argsort(token, kind="stable")  # by token; documents stay in order within a token
        for name, array in (("token", token.astype(np.int32)), ("doc", (doc_local + n_docs).astype(np.int32)),
                            ("tf", tf)):
            np.save(tmp / f"chunk{n_chunks:06d}.{name}.npy", array[order])
        lengths.append(doc_len)
        n_docs += len(chunk)
        n_chunks += 1
        bar.update(len(chunk))
    bar.close()
    return vocab, df[: len(vocab)], np.concatenate(lengths) if lengths else np.zeros(0, np.int64), n_chunks


def _release(array: np.memmap, lo: int, hi: int, dirty: bool) -> None:
    """Flush (``dirty``) and drop items ``[lo, hi)`` of a memmap from this process's resident set, page-aligned
    inwards-out (they stay in the page cache and are re-read on access), so files streamed through memory maps do
    not accumulate in the build's memory. No-op where madvise is missing."""
    raw = getattr(array, "_mmap", None)
    if raw is None or not hasattr(mmap, "MADV_DONTNEED") or hi <= lo:
        return
    base = array.offset % mmap.ALLOCATIONGRANULARITY  # the array's first byte within the mapping
    first = (base + lo * array.itemsize) // mmap.PAGESIZE * mmap.PAGESIZE
    last = -(-(base + hi * array.itemsize) // mmap.PAGESIZE) * mmap.PAGESIZE
    length = min(last, len(raw)) - first
    if dirty:
        raw.flush(first, length)
    raw.madvise(mmap.MADV_DONTNEED, first, length)


def token_blocks(indptr: np.ndarray, block_nnz: int) -> list[tuple[int, int]]:
    """Consecutive token ranges [t0, t1) holding about ``block_nnz`` postings each (at least one token each).

    indptr: (n_vocab + 1,) int64, the CSC column pointers."""
    blocks, t0, n_vocab = [], 0, len(indptr) - 1
    while t0 < n_vocab:
        t1 = int(np.searchsorted(indptr, indptr[t0] + block_nnz, side="right")) - 1
        t1 = min(max(t1, t0 + 1), n_vocab)
        blocks.append((t0, t1))
        t0 = t1
    return blocks


def _merge(tmp: Path, out: Path, n_chunks: int, df: np.ndarray, doc_len: np.ndarray, k1: float, b: float,
           block_nnz: int, progress: bool) -> int:
    """Pass 2: write the CSC arrays (data float32, indices int32, indptr int64) block of tokens by block of tokens.

    Each spilled chunk is sorted by token, so a block's postings are one slice per chunk (found by binary search
    on the memory-mapped token array); concatenated in chunk order and stably sorted by token, the documents of
    each token come out in order, and the block is written sequentially at ``indptr[t0]``."""
    n_docs, n_vocab = len(doc_len), len(df) + 1  # + bm25s's empty token "" (an empty column)
    avgdl = float(doc_len.mean())
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
    idf = np.r_[idf, np.float32(0)]
    norm = (k1 * (1 - b + b * doc_len / avgdl)).astype(np.float32)  # per document: the tf denominator's constant
    indptr = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1 : len(df) + 1])
    indptr[-1] = indptr[-2]
    nnz = int(indptr[-1])
    data = np.lib.format.open_memmap(out / DATA, mode="w+", dtype=np.float32, shape=(nnz,))
    indices = np.lib.format.open_memmap(out / INDICES, mode="w+", dtype=np.int32, shape=(nnz,))
    chunks = [{k: np.load(tmp / f"chunk{c:06d}.{k}.npy", mmap_mode="r") for k in ("token", "doc", "tf")}
              for c in range(n_chunks)]
    cursors = [0] * n_chunks
    for t0, t1 in tqdm(token_blocks(indptr, block_nnz), desc="BM25 pass 2/2: write", unit="block",
                       disable=not progress):
        parts, block_starts = [], list(cursors)
        for c, chunk in enumerate(chunks):  # blocks ascend, so each chunk is read forward from its cursor
            lo = cursors[c]
            hi = lo + int(np.searchsorted(chunk["token"][lo:], t1))
            if hi > lo:
                parts.append((chunk["token"][lo:hi], chunk["doc"][lo:hi], chunk["tf"][lo:hi]))
            cursors[c] = hi
        if not parts:
            continue
        token, doc, tf = (np.concatenate(p) for p in zip(*parts, strict=True))
        order = np.argsort(token, kind="stable")
        token, doc, tf = token[order], doc[order], tf[order]
        start, end = int(indptr[t0]), int(indptr[t1])
        if end - start != len(token):
            raise RuntimeError(f"BM25 build: block {t0}-{t1} has {len(token)} postings, expected {end - start}")
        data[start:end] = idf[token] * (tf / (tf + norm[doc]))
        indices[start:end] = doc
        _release(data, start, end, dirty=True)
        _release(indices, start, end, dirty=True)
        for chunk, lo, hi in zip(chunks, block_starts, cursors, strict=True):
            _release(chunk["token"], lo, len(chunk["token"]), dirty=False)  # also the binary search's pages
            _release(chunk["doc"], lo, hi, dirty=False)
            _release(chunk["tf"], lo, hi, dirty=False)
    del data, indices
    np.save(out / INDPTR, indptr)
    return nnz


def build_index(
    texts: Iterable[str],
    out_dir: str | Path,
    chunk_size: int = 10_000,
    k1: float = 1.5,
    b: float = 0.75,
    stopwords: str | None = "english",
    progress: bool = True,
    total: int | None = None,
    extra_manifest: dict | None = None,
    block_nnz: int = 500_000,
) -> BuildStats:
    """Index the documents of ``texts`` (consumed once, in order; document i = the i-th text) into ``out_dir``.

    chunk_size: documents tokenised at a time (pass 1); block_nnz: postings written at a time (pass 2)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bm25_chunks_", dir=out))
    try:
        vocab, df, doc_len, n_chunks = _spill(texts, tmp, chunk_size, stopwords, progress, total)
        if len(doc_len) == 0:
            raise ValueError("cannot index an empty corpus (no documents)")
        if doc_len.sum() == 0:
            raise ValueError("cannot index a corpus without any token (after stop-word removal)")
        nnz = _merge(tmp, out, n_chunks, df, doc_len, k1, b, block_nnz, progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    vocab[""] = len(vocab)
    (out / VOCAB).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    params = dict(k1=k1, b=b, delta=0.5, method="lucene", idf_method="lucene", dtype="float32", int_dtype="int32",
                  num_docs=len(doc_len), version=bm25s.__version__, backend="numpy")
    (out / PARAMS).write_text(json.dumps(params, indent=1), encoding="utf-8")
    avgdl = float(doc_len.mean())
    manifest = dict(format=FORMAT, version=FORMAT_VERSION, num_docs=len(doc_len), vocab_size=len(vocab), nnz=nnz,
                    avgdl=avgdl, k1=k1, b=b, stopwords=stopwords, **(extra_manifest or {}))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return BuildStats(len(doc_len), len(vocab), nnz, avgdl, n_chunks)
