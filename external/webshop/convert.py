"""Convert WebShop's full data files into a catalog folder that ``ragen.env.webshop`` serves from disk.

    python -m ragen_external.webshop.convert --items items_shuffle.json --attrs items_ins_v2.json \\
        --human items_human_ins.json --out DIR [--nouns auto|spacy|heuristic] [--chunk-size 10000] [--limit N]
        [--noun-batch-size 256]

Inputs are WebShop's own files, unchanged (schema: ``ragen/env/webshop/data.py``): ``items_shuffle.json`` (a JSON
array of 1.18M products, ~5 GB), ``items_ins_v2.json`` (``{asin: {attributes, ...}}``) and ``items_human_ins.json``
(``{asin: [human instruction, ...]}``, small). Memory stays bounded however big they are:

1. the attributes object is streamed (``ijson``) into a temporary SQLite table keyed by ASIN;
2. the product array is streamed record by record (``ijson``), with a progress bar over the file's bytes; each
   product is processed exactly as ``load_catalog`` would (``build_product``: options, price draw seeded per ASIN,
   attributes), gets its name nouns precomputed (``nouns.make_batch_noun_extractor``: the env's extractor, spaCy
   when a model is installed, else the heuristic, one chunk of titles per call; lists in the record are kept), is
   appended to ``products.jsonl`` and its search text (``ProductSearch.document``) goes to the chunked BM25
   builder (``ragen_external.search.index``);
3. the human goals are built with ``build_goals`` from the goal products kept on the way (a few thousand).

Output (``DIR``): ``catalog.json`` (manifest), ``products.jsonl`` + ``products.offsets.npy``, ``asins.npy`` +
``asin_order.npy`` (ASIN lookup), ``goals.jsonl`` and ``index/`` (disk BM25). Use it with ``env.config.data_dir=DIR``.
Held in memory: one chunk of products, the set of ASINs seen (duplicates are skipped, as ``load_catalog`` does:
~100 MB for 1.18M), the goal products, the BM25 vocabulary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from ragen_external.progress import progress_file
from ragen_external.search.index import build_index, chunked
from ragen_external.webshop.nouns import BatchNouns, make_batch_noun_extractor

from ragen.env.bm25_disk import JsonlWriter
from ragen.env.webshop.data import (
    ASIN_ORDER_FILE,
    ASINS_FILE,
    CONVERTED_FORMAT,
    CONVERTED_MANIFEST,
    CONVERTED_VERSION,
    GOALS_FILE,
    INDEX_DIR,
    PRODUCTS_FILE,
    Product,
    build_goals,
    build_product,
)
from ragen.env.webshop.pages import ProductSearch

try:
    import ijson
except ImportError as err:  # pragma: no cover - the webshop extra installs it
    raise ImportError("ragen_external.webshop needs ijson: pip install -e .[webshop]") from err


@dataclass(frozen=True)
class ConvertStats:
    """What a conversion produced."""

    products: int
    duplicates: int
    without_attributes: int
    goals: int
    noun_extractor: str
    index_terms: int


def attribute_table(attrs_path: Path, db: sqlite3.Connection, progress: bool, batch: int = 10_000) -> int:
    """Stream ``items_ins_v2`` (``{asin: {attributes: [...], ...}}``) into table ``attrs``; returns the row count."""
    db.execute("CREATE TABLE attrs (asin TEXT PRIMARY KEY, attributes TEXT)")
    rows: list[tuple[str, str]] = []
    count = 0
    with progress_file(attrs_path, "attributes", progress) as f:
        for asin, entry in ijson.kvitems(f, "", use_float=True):
            attributes = entry.get("attributes") if isinstance(entry, dict) else None
            rows.append((str(asin), json.dumps([str(a) for a in attributes or []])))
            if len(rows) >= batch:
                count += len(rows)
                db.executemany("INSERT OR REPLACE INTO attrs VALUES (?, ?)", rows)  # later keys win, as in json.load
                rows = []
    db.executemany("INSERT OR REPLACE INTO attrs VALUES (?, ?)", rows)
    db.commit()
    return count + len(rows)


def lookup_attributes(db: sqlite3.Connection, asins: list[str], batch: int = 500) -> dict[str, list[str]]:
    """Attributes of ``asins`` (absent ASINs are left out)."""
    found: dict[str, list[str]] = {}
    for i in range(0, len(asins), batch):
        part = asins[i : i + batch]
        query = f"SELECT asin, attributes FROM attrs WHERE asin IN ({','.join('?' * len(part))})"
        found.update((a, json.loads(v)) for a, v in db.execute(query, part))
    return found


class _Converter:
    """The streaming pass over the products (a generator of search texts for the BM25 builder)."""

    def __init__(self, db: sqlite3.Connection, human: dict[str, Any], out: Path, nouns: BatchNouns, seed: int,
                 chunk_size: int):
        self.db, self.human, self.nouns, self.seed, self.chunk_size = db, human, nouns, seed, chunk_size
        self.writer = JsonlWriter(out / PRODUCTS_FILE)
        self.asin_chunks: list[np.ndarray] = []
        self.seen: set[str] = set()
        self.goal_products: dict[str, Product] = {}
        self.duplicates = self.without_attributes = 0

    def unique_records(self, records: Iterator[Any]) -> Iterator[dict]:
        for raw in records:
            asin = raw.get("asin") if isinstance(raw, dict) else None
            if not asin:
                continue
            if str(asin) in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(str(asin))
            yield raw

    def documents(self, records: Iterator[Any]) -> Iterator[str]:
        for chunk in chunked(self.unique_records(records), self.chunk_size):
            asins = [str(raw["asin"]) for raw in chunk]
            attributes = lookup_attributes(self.db, asins)
            self.without_attributes += sum(a not in attributes for a in asins)
            products = [build_product(raw, attributes.get(str(raw["asin"]), []), self.seed) for raw in chunk]
            todo = [p for p in products if p.name_nouns is None]  # lists already in the record are kept
            for product, nouns in zip(todo, self.nouns([p.title for p in todo]), strict=True):
                product.name_nouns = nouns
            for product in products:
                self.writer.write(dataclasses.asdict(product))
                if product.asin in self.human:
                    self.goal_products[product.asin] = product
                yield ProductSearch.document(product)
            self.asin_chunks.append(np.asarray(asins, dtype=str))


def convert(
    items: str | Path,
    attrs: str | Path,
    human: str | Path,
    out: str | Path,
    nouns: str = "auto",
    spacy_model: str = "en_core_web_sm",
    seed: int = 233,
    chunk_size: int = 10_000,
    limit: int | None = None,
    progress: bool = True,
    noun_batch_size: int = 256,
) -> ConvertStats:
    """Convert the three WebShop files into the catalog folder ``out`` (see the module docstring)."""
    items, attrs, human_path, out = (Path(p).expanduser() for p in (items, attrs, human, out))
    for flag, path in (("--items", items), ("--attrs", attrs), ("--human", human_path)):
        if not path.is_file():
            raise FileNotFoundError(f"{flag} {str(path)!r} not found (see external/webshop/README.md for the files)")
    extractor, noun_name = make_batch_noun_extractor(nouns, spacy_model, noun_batch_size)
    out.mkdir(parents=True, exist_ok=True)
    human_goals = json.loads(human_path.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        db = sqlite3.connect(Path(tmp) / "attributes.sqlite")
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            attribute_table(attrs, db, progress)
            conv = _Converter(db, human_goals, out, extractor, seed, chunk_size)
            with progress_file(items, "products", progress) as f:
                records = islice(ijson.items(f, "item", use_float=True), limit)
                index_stats = build_index(conv.documents(records), out / INDEX_DIR, chunk_size=chunk_size,
                                          progress=progress, extra_manifest={"source": items.name})
        finally:
            db.close()
    n_products = conv.writer.close()
    asins = np.concatenate(conv.asin_chunks)
    np.save(out / ASINS_FILE, asins)
    np.save(out / ASIN_ORDER_FILE, np.argsort(asins, kind="stable"))
    goals = build_goals(conv.goal_products, human_goals, seed)
    with (out / GOALS_FILE).open("w", encoding="utf-8") as f:
        for goal in goals:
            f.write(json.dumps(dataclasses.asdict(goal), ensure_ascii=False) + "\n")
    stats = ConvertStats(n_products, conv.duplicates, conv.without_attributes, len(goals), noun_name,
                         index_stats.vocab_size)
    sources = dict(items=items.name, attrs=attrs.name, human=human_path.name)
    manifest = dict(format=CONVERTED_FORMAT, version=CONVERTED_VERSION, seed=seed, sources=sources,
                    **dataclasses.asdict(stats))
    (out / CONVERTED_MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", required=True, help="items_shuffle.json (products, a JSON array)")
    parser.add_argument("--attrs", required=True, help="items_ins_v2.json ({asin: {attributes, ...}})")
    parser.add_argument("--human", required=True, help="items_human_ins.json ({asin: [instructions]})")
    parser.add_argument("--out", required=True, help="catalog folder to write (env.config.data_dir)")
    parser.add_argument("--nouns", default="auto", choices=("auto", "spacy", "heuristic"),
                        help="name-noun extractor (auto: spaCy when the model is installed, else the heuristic)")
    parser.add_argument("--spacy-model", default="en_core_web_sm")
    parser.add_argument("--noun-batch-size", type=int, default=256, help="titles per spaCy nlp.pipe batch")
    parser.add_argument("--seed", type=int, default=233, help="seed of the price draws (WebShop: 233)")
    parser.add_argument("--chunk-size", type=int, default=10_000, help="products per processing / BM25 chunk")
    parser.add_argument("--limit", type=int, default=None, help="convert only the first N products")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    stats = convert(args.items, args.attrs, args.human, args.out, args.nouns, args.spacy_model, args.seed,
                    args.chunk_size, args.limit, progress=not args.no_progress, noun_batch_size=args.noun_batch_size)
    print(f"converted {stats.products} products ({stats.duplicates} duplicates skipped, {stats.without_attributes} "
          f"without attributes), {stats.goals} goals, nouns by {stats.noun_extractor}, {stats.index_terms} BM25 terms"
          f" into {args.out} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
