"""ragen_external.search: the chunked disk BM25 index against bm25s's in-memory index, and search_qa playing on it."""

import json
import re

import bm25s
import numpy as np
import pytest
from ragen_external.search import build as build_cli
from ragen_external.search.index import build_index, token_blocks
from ragen_external.search.sample import passages, unique_words, write_dump
from tqdm import tqdm

import ragen.env as E
from ragen.env.bm25 import BM25Index
from ragen.env.bm25_disk import DiskBM25Index
from ragen.env.search_qa.data import PassageStore

N = 3000


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A 3000-passage dump indexed in chunks of 700 (5 chunks, the last one short) through the CLI."""
    root = tmp_path_factory.mktemp("search")
    dump = write_dump(root / "dump.jsonl", N, seed=3)
    build_cli.main(["--corpus", str(dump), "--out", str(root / "index"), "--chunk-size", "700", "--no-progress"])
    records = list(passages(N, seed=3))
    return root, DiskBM25Index(root / "index"), records


def queries(records, rng, n):
    """Random 2-5 word queries drawn from passages (including common words and titles)."""
    out = []
    for _ in range(n):
        r = records[rng.integers(len(records))]
        words = (r["title"] + " " + r["text"].rstrip(".")).split()
        out.append(" ".join(rng.choice(words, size=rng.integers(2, 6), replace=False)))
    return out


def test_exact_top1_for_unique_words(built):
    _, index, records = built
    store = PassageStore(built[0] / "index")
    assert index.size == len(store) == N
    for i in np.random.default_rng(0).choice(N, size=40, replace=False):
        a, b = unique_words(int(i))
        hits = index.search(f"{a} {b}", 5)
        assert [h.index for h in hits] == [i]  # no other passage shares either word
        assert store[int(i)].pid == f"doc{i}" and store[int(i)].title == records[i]["title"]


def test_agrees_with_unchunked_bm25s(built):
    """Same scores (float32 rounding) and same top-10 ids as one bm25s index over the whole corpus."""
    _, index, records = built
    texts = [f"{r['title']} {r['text']}" for r in records]
    reference = bm25s.BM25()
    reference.index(bm25s.tokenize(texts, stopwords="english", return_ids=False, show_progress=False),
                    show_progress=False)
    for query in queries(records, np.random.default_rng(1), 30):
        terms = [t for t in bm25s.tokenize([query], stopwords="english", return_ids=False, show_progress=False)[0]
                 if t in reference.vocab_dict]
        ref = np.asarray(reference.get_scores(terms), dtype=np.float64)
        got = index.scores(query)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        ref_top = [i for i in np.lexsort((np.arange(N), -ref))[:10] if ref[i] > 0]
        got_top = [h.index for h in index.search(query, 10)]
        if len(ref_top) == 10 and np.isclose(ref[ref_top[-1]], np.sort(ref)[-11]):
            ref_top, got_top = ref_top[:-1], got_top[:-1]  # a tie across the cut: either order is right
        assert got_top == ref_top, query


def test_chunking_does_not_change_the_index(built, tmp_path):
    """One chunk and one block, the CLI's 700-document chunks, and 250-document chunks written in blocks of ~3000
    postings (~50 blocks): identical arrays."""
    root, index, records = built
    texts = [f"{r['title']} {r['text']}" for r in records]
    build_index(texts, tmp_path / "one", chunk_size=10 * N, block_nnz=10**9, progress=False)
    build_index(texts, tmp_path / "many", chunk_size=250, block_nnz=3000, progress=False)
    for name in ("indptr", "indices", "data"):
        one = np.load(tmp_path / "one" / f"{name}.csc.index.npy")
        for other in (root / "index", tmp_path / "many"):
            assert np.array_equal(np.load(other / f"{name}.csc.index.npy"), one), (name, other)
    assert DiskBM25Index(tmp_path / "many").search("kalo mine", 5) == index.search("kalo mine", 5)


def test_token_blocks_hand_example():
    # postings per token: 3, 0, 7, 1; blocks of ~4: [t0, t1) = [0, 2) (3), [2, 3) (7: one token never splits), [3, 4)
    assert token_blocks(np.array([0, 3, 3, 10, 11]), 4) == [(0, 2), (2, 3), (3, 4)]
    assert token_blocks(np.array([0, 3, 3, 10, 11]), 100) == [(0, 4)]


def test_search_qa_plays_on_the_disk_index(built, tmp_path):
    root, _, records = built
    qa = tmp_path / "qa.jsonl"
    with qa.open("w") as f:
        for i in (42, 1234):
            a, b = unique_words(i)
            f.write(json.dumps({"id": f"q{i}", "question": f"Which word follows {a}?", "answers": [b]}) + "\n")
    env = E.make("search_qa", qa_path=str(qa), index_path=str(root / "index"), top_k=2)
    assert len(env.passages) == N
    env.reset(0)
    r1 = env.step('<tool>{"name": "search", "args": {"query": "qx42a"}}</tool>')
    assert r1.observation.startswith(f"<result>\nDoc 1 (Title: {records[42]['title']}) {records[42]['text'][:20]}")
    assert (r1.info["step_reward"], r1.reward, r1.done) == (pytest.approx(0.7), pytest.approx(0.7), False)
    r2 = env.step("<answer>qz42b</answer>")
    assert r2.info["success"] and r2.reward == pytest.approx(1.4)  # exact 1.0 + format 0.2 + xml 0.2
    # the same episode on the in-memory path gives the same observations
    mem = E.make("search_qa", qa_path=str(qa), corpus_path=str(root / "dump.jsonl"), top_k=2)
    mem.reset(0)
    assert mem.step('<tool>{"name": "search", "args": {"query": "qx42a"}}</tool>').observation == r1.observation
    env.reset(1)  # the expert: its query (the question) puts passage 1234 first, then it answers
    assert env.expert_query() == "Which word follows qx1234a?"
    rewards = [env.step(env.expert_action()).reward for _ in range(2)]
    assert rewards == [pytest.approx(0.7), pytest.approx(1.4)] and env.done


def test_bad_index_path_names_the_key(tmp_path, built):
    with pytest.raises(ValueError, match="env.config.index_path"):
        E.make("search_qa", index_path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="index_path or env.config.corpus_path, not both"):
        E.make("search_qa", index_path=str(built[0] / "index"), corpus_path=str(built[0] / "dump.jsonl"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "ragen_index.json").write_text(json.dumps({"format": "other", "version": 9}))
    with pytest.raises(ValueError, match="expected 'ragen-bm25-disk'"):
        DiskBM25Index(tmp_path / "bad")


def test_empty_corpus_is_rejected(tmp_path):
    (tmp_path / "empty.jsonl").write_text('{"id": 1, "title": "t", "text": ""}\n')
    with pytest.raises(ValueError, match="empty corpus"):
        build_cli.build(tmp_path / "empty.jsonl", tmp_path / "out", progress=False)


def test_in_memory_and_disk_indexes_share_semantics(tmp_path):
    """Ties by document order and stop-word-only queries, as ragen.env.bm25.BM25Index does."""
    docs = ["red apple", "red apple", "green pear", "the"]
    dump = tmp_path / "d.jsonl"
    dump.write_text("".join(json.dumps({"id": i, "title": "", "text": t}) + "\n" for i, t in enumerate(docs)))
    build_cli.build(dump, tmp_path / "i", chunk_size=3, progress=False)
    disk, mem = DiskBM25Index(tmp_path / "i"), BM25Index([f" {t}" for t in docs])
    for query, k in (("red", 5), ("red", 1), ("pear apple", 5), ("the", 5), ("zebra", 5), ("red", 0)):
        assert [h.index for h in disk.search(query, k)] == [h.index for h in mem.search(query, k)]
        np.testing.assert_allclose([h.score for h in disk.search(query, k)],
                                   [h.score for h in mem.search(query, k)], rtol=1e-6)
    assert [h.index for h in disk.search("red", 5)] == [0, 1]


def test_build_progress_bar_counts_the_dump_bytes(tmp_path, capsys):
    """Pass 1 reads a dump of unknown length: the bar's total is the file's size (percentage and ETA)."""
    dump = write_dump(tmp_path / "dump.jsonl", 300, seed=1)
    build_cli.build(dump, tmp_path / "index", chunk_size=128, progress=True)
    err = capsys.readouterr().err
    size = tqdm.format_sizeof(dump.stat().st_size)
    assert re.search(rf"corpus: 100%\|[^\r\n]*\| {re.escape(size)}/{re.escape(size)} \[", err), err
    assert "BM25 pass 2/2: write: 100%" in err
