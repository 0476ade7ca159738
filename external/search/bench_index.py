"""Bench the disk BM25 index: build time, peak memory and query latency on a generated Wikipedia-style dump.

    python external/search/bench_index.py [--passages 50000] [--chunk-size 10000] [--queries 300]

Writes a synthetic dump (``sample.py``) to a temporary folder, builds the index with the CLI in a child process
(so its peak RSS is the build's alone: ``getrusage(RUSAGE_CHILDREN)``), then loads it memory-mapped and times
``search(query, k=3)`` for queries of 3-6 words taken from random passages (the env's call).
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from ragen_external.search.sample import write_dump

from ragen.env.bm25_disk import DiskBM25Index
from ragen.env.search_qa.data import PassageStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=50_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dump, out = Path(tmp) / "dump.jsonl", Path(tmp) / "index"
        start = time.perf_counter()
        write_dump(dump, args.passages)
        print(f"dump: {args.passages} passages, {dump.stat().st_size / 2**20:.1f} MiB, "
              f"generated in {time.perf_counter() - start:.1f}s")
        cmd = [sys.executable, "-m", "ragen_external.search.build", "--corpus", str(dump), "--out", str(out),
               "--chunk-size", str(args.chunk_size), "--no-progress"]
        start = time.perf_counter()
        subprocess.run(cmd, check=True)
        build_s = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        size_mib = sum(f.stat().st_size for f in out.iterdir()) / 2**20
        print(f"build: {build_s:.1f}s wall (incl. interpreter start), peak RSS {peak_mib:.0f} MiB, "
              f"index folder {size_mib:.1f} MiB, chunk size {args.chunk_size}")

        start = time.perf_counter()
        index, passages = DiskBM25Index(out), PassageStore(out)
        print(f"load (mmap): {1000 * (time.perf_counter() - start):.0f} ms")
        rng = random.Random(1)
        queries = []
        for _ in range(args.queries):
            words = passages[rng.randrange(len(passages))].text.rstrip(".").split()
            queries.append(" ".join(rng.sample(words, rng.randint(3, 6))))
        latencies = []
        for query in queries:
            start = time.perf_counter()
            hits = index.search(query, 3)
            _ = [passages[h.index] for h in hits]
            latencies.append(1000 * (time.perf_counter() - start))
        p50, p95 = np.percentile(latencies, [50, 95])
        print(f"query (search k=3 + fetch passages): p50 {p50:.2f} ms, p95 {p95:.2f} ms over {len(queries)} queries")
        own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"querying process (index loaded, vocabulary dict in memory): peak RSS {own_peak:.0f} MiB")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
