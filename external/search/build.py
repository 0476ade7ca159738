"""Build a disk BM25 index folder for ``search_qa`` from a JSONL dump of ``{id, title, text}`` (or ``{id, contents}``).

    python -m ragen_external.search.build --corpus dump.jsonl --out INDEX_DIR [--chunk-size 10000]

The dump is read one line at a time, with a progress bar over its bytes (percentage and ETA; the number of
passages is unknown until the end); each passage goes to ``INDEX_DIR/passages.jsonl`` (the env's passage store,
with its offsets file) and its ``"{title} {text}"`` (what the in-memory env indexes) to the chunked BM25 builder
(``index.py``). Records without text are skipped, as ``load_corpus`` does. Then use it with
``env.config.index_path=INDEX_DIR``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

from ragen_external.progress import progress_file
from ragen_external.search.index import BuildStats, build_index

from ragen.env.bm25_disk import JsonlWriter
from ragen.env.search_qa.data import PASSAGES_FILE, parse_passage


def iter_dump(path: Path, writer: JsonlWriter, progress: bool = False) -> Iterator[str]:
    """The indexed text of each passage of the dump, writing the passage to ``writer`` as it goes (with a progress
    bar over the dump's bytes: the number of passages is not known before the end)."""
    with progress_file(path, "corpus", progress) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except ValueError as err:
                raise ValueError(f"{path}:{i + 1}: not a JSON line ({err})") from err
            passage = parse_passage(record, i)
            if passage is None:
                continue
            writer.write({"id": passage.pid, "title": passage.title, "text": passage.text})
            yield f"{passage.title} {passage.text}"


def build(corpus: str | Path, out: str | Path, chunk_size: int = 10_000, progress: bool = True) -> BuildStats:
    """Index ``corpus`` into the folder ``out`` (created); returns the build's counts."""
    corpus, out = Path(corpus).expanduser(), Path(out).expanduser()
    if not corpus.is_file():
        raise FileNotFoundError(f"--corpus {str(corpus)!r} not found")
    out.mkdir(parents=True, exist_ok=True)
    writer = JsonlWriter(out / PASSAGES_FILE)
    try:
        stats = build_index(iter_dump(corpus, writer, progress), out, chunk_size=chunk_size, progress=progress,
                            extra_manifest={"source": corpus.name, "store": PASSAGES_FILE})
    finally:
        n_passages = writer.close()
    if n_passages != stats.num_docs:
        raise RuntimeError(f"wrote {n_passages} passages but indexed {stats.num_docs}")
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="JSONL dump, one {id, title, text} per line")
    parser.add_argument("--out", required=True, help="index folder to create (env.config.index_path)")
    parser.add_argument("--chunk-size", type=int, default=10_000, help="documents tokenised per chunk")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    stats = build(args.corpus, args.out, args.chunk_size, progress=not args.no_progress)
    print(f"indexed {stats.num_docs} passages ({stats.vocab_size} terms, {stats.nnz} postings, {stats.chunks} chunks)"
          f" into {args.out} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
