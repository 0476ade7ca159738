"""Bench the WebShop converter's memory: peak RSS while converting generated catalogs of growing size.

    python external/webshop/bench_convert.py [--sizes 5000 50000] [--chunk-size 10000]

For each size it writes WebShop-schema files (``sample.py``, streamed), converts them in a child process that
reports its own peak RSS (``getrusage(RUSAGE_SELF)``), and, for contrast, loads the same raw files with the
in-memory loader (``load_catalog``: ``json.load`` of the whole array) in another child. Bounded memory shows as
a converter peak that barely grows with the catalog, while the in-memory loader's grows linearly.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragen_external.webshop.sample import write_files

CONVERT = """
from ragen.allocator import tune_process; tune_process()
import resource, sys
from ragen_external.webshop import convert
convert.main(sys.argv[1:])
print("PEAK_MIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""
LOAD = """
from ragen.allocator import tune_process; tune_process()
import resource, sys
from ragen.env.webshop.data import load_catalog
catalog = load_catalog(sys.argv[1])
print(len(catalog.products), "products")
print("PEAK_MIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""
BASELINE = """
from ragen.allocator import tune_process; tune_process()
import resource
import ijson, numpy, bm25s, tqdm, sqlite3
import ragen.env.webshop, ragen_external.search.index
print("PEAK_MIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def run(code: str, *args: str) -> tuple[float, float, str]:
    """(peak RSS MiB, wall seconds, stdout) of ``python -c code args``."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True).stdout
    peak = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("PEAK_MIB"))
    return peak, time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000, 50_000])
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--goal-every", type=int, default=100,
                        help="one human goal per N products (WebShop: ~12k goals for 1.18M products, ~1 per 100)")
    args = parser.parse_args()
    base, _, _ = run(BASELINE)
    print(f"baseline (interpreter + imports): {base:.0f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            paths = write_files(Path(tmp) / f"raw{n}", n, seed=0, goal_every=args.goal_every)
            mib = paths["items_shuffle"].stat().st_size / 2**20
            peak, wall, out = run(CONVERT, "--items", str(paths["items_shuffle"]), "--attrs",
                                  str(paths["items_ins_v2"]), "--human", str(paths["items_human_ins"]), "--out",
                                  str(Path(tmp) / f"conv{n}"), "--nouns", "heuristic", "--chunk-size",
                                  str(args.chunk_size), "--no-progress")
            print(out.splitlines()[0])
            load_peak, _, _ = run(LOAD, str(paths["items_shuffle"].parent))
            print(f"{n} products ({mib:.1f} MiB items file): convert {wall:.1f}s, peak RSS {peak:.0f} MiB "
                  f"(+{peak - base:.0f} over baseline); in-memory load_catalog peak {load_peak:.0f} MiB")


if __name__ == "__main__":
    main()
