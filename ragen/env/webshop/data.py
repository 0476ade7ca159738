"""WebShop catalog and goals, read from WebShop's own JSON files.

Files (names configurable, all in one ``data_dir``):

* products, ``items_shuffle*.json``: a list of ``{asin, name, full_description, small_description, pricing,
  product_category, category, query, customization_options {Name: [{value, ...}]}, ...}``; an optional
  ``name_nouns`` list (precomputed nouns of ``name``, used by the type score) is read when present;
* attributes, ``items_ins_v2*.json``: ``{asin: {attributes: [...], ...}}``;
* human goals, ``items_human_ins.json``: ``{asin: [{instruction, instruction_attributes (or attributes),
  instruction_options, ...}]}``.

Processing follows the original environment: option names/values are lower-cased and ``/`` becomes
`` | ``; a product's price is its listed price, or for a range ``$a - $b`` a uniform draw in the range
(seeded per ASIN, so it is stable); a goal's ``price_upper`` is the larger of two distinct values drawn
from the first four multiples of 10 above that price, stated in the instruction as
``, and price lower than X dollars`` (no bound when fewer than two such values exist); human goals
without attributes are dropped. Splits: after a fixed shuffle, test = first ``test_size`` goals,
validation = next ``val_size``, train = the rest (500 / 1000 in WebShop).

A *converted* catalog folder (``python -m ragen_external.webshop.convert``, for the full 1.18M-product files) is
read instead when ``data_dir`` holds ``catalog.json``: products are served one at a time from ``products.jsonl``
(``LazyProducts``), goals come precomputed from ``goals.jsonl`` and the BM25 index from ``index/`` (memory-mapped).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragen.env.bm25_disk import JsonlStore

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "webshop"
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_BOUND = 1_000_000.0
DEFAULT_PRICE = 100.0
SPLITS = ("train", "val", "test", "all")
CONVERTED_MANIFEST = "catalog.json"
CONVERTED_FORMAT, CONVERTED_VERSION = "ragen-webshop-catalog", 1
PRODUCTS_FILE, GOALS_FILE, ASINS_FILE, ASIN_ORDER_FILE, INDEX_DIR = (
    "products.jsonl", "goals.jsonl", "asins.npy", "asin_order.npy", "index")


@dataclass
class Product:
    """One catalog item as the pages and the scorer see it."""

    asin: str
    title: str
    description: str
    bullet_points: list[str]
    price: float
    product_category: str
    category: str
    query: str
    options: dict[str, list[str]]
    attributes: list[str]
    rating: str = "N.A."
    name_nouns: list[str] | None = None


@dataclass
class Goal:
    """A shopping instruction and what the scorer compares the purchase against."""

    asin: str
    category: str
    query: str
    name: str
    product_category: str
    instruction_text: str
    attributes: list[str]
    price_upper: float
    goal_options: list[str]
    name_nouns: list[str] | None = None


@dataclass
class Catalog:
    """Products by ASIN (file order kept) and all human goals (file order)."""

    products: Mapping[str, Product]  # a dict, or LazyProducts for a converted catalog
    goals: list[Goal] = field(default_factory=list)
    converted_dir: Path | None = None  # set for a converted catalog (its BM25 index is in converted_dir / "index")


class LazyProducts(Mapping):
    """The products of a converted catalog by ASIN, read from ``products.jsonl`` on access (recent ones cached).

    ``asins.npy`` holds the ASINs in file order (row i = line i) and ``asin_order.npy`` their sort order, so a
    lookup is a binary search over memory-mapped arrays: no per-product Python object stays in memory."""

    def __init__(self, root: Path):
        self.records = JsonlStore(root / PRODUCTS_FILE)
        self.asins = np.load(root / ASINS_FILE, mmap_mode="r")
        self.order = np.load(root / ASIN_ORDER_FILE, mmap_mode="r")
        if not len(self.asins) == len(self.order) == len(self.records):
            raise ValueError(f"converted WebShop catalog {str(root)!r} is inconsistent (asins / products differ)")

    def row(self, asin: str) -> int | None:
        """The line of ``asin`` in products.jsonl, or None."""
        j = int(np.searchsorted(self.asins, asin, sorter=self.order))
        if j < len(self.order) and self.asins[self.order[j]] == asin:
            return int(self.order[j])
        return None

    def __getitem__(self, asin: str) -> Product:
        row = self.row(asin) if isinstance(asin, str) else None
        if row is None:
            raise KeyError(asin)
        return Product(**self.records[row])

    def __contains__(self, asin: object) -> bool:
        return isinstance(asin, str) and self.row(asin) is not None

    def __iter__(self) -> Iterator[str]:
        return (str(a) for a in self.asins)

    def __len__(self) -> int:
        return len(self.asins)


def load_converted(root: Path) -> Catalog:
    """A catalog folder written by ``ragen_external.webshop.convert`` (see the module docstring)."""
    manifest = json.loads((root / CONVERTED_MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("format") != CONVERTED_FORMAT or manifest.get("version") != CONVERTED_VERSION:
        raise ValueError(
            f"data_dir={str(root)!r}: {CONVERTED_MANIFEST} has format {manifest.get('format')!r} version "
            f"{manifest.get('version')!r}, expected {CONVERTED_FORMAT!r} version {CONVERTED_VERSION}; convert again"
        )
    with (root / GOALS_FILE).open(encoding="utf-8") as f:
        goals = [Goal(**json.loads(line)) for line in f if line.strip()]
    return Catalog(products=LazyProducts(root), goals=goals, converted_dir=root)


def parse_pricing(pricing: Any) -> list[float]:
    """``"$12.99"`` -> [12.99]; ``"$10.71 - $18.34"`` -> [10.71, 18.34]; missing or unreadable -> [100.0]."""
    if not isinstance(pricing, str) or "$" not in pricing:
        return [DEFAULT_PRICE]
    values = []
    for part in pricing.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            values.append(float(digits))
        except ValueError:
            continue
    return values or [DEFAULT_PRICE]


def product_price(asin: str, pricing: list[float], seed: int = 233) -> float:
    """The price the shop charges: the single price, or a uniform draw in ``pricing[:2]`` seeded per ASIN."""
    if len(pricing) == 1:
        return round(pricing[0], 2)
    low, high = sorted(pricing[:2])
    return round(random.Random(f"{seed}:price:{asin}").uniform(low, high), 2)


def _options(raw: Any) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    if not isinstance(raw, dict):
        return options
    for name, contents in raw.items():
        if not contents:
            continue
        values = [str(c["value"]).strip().replace("/", " | ").lower() for c in contents if isinstance(c, dict)]
        values = [v for v in values if v]
        if values:
            options[str(name).lower()] = values
    return options


def _text_list(raw: Any) -> list[str]:
    if isinstance(raw, list):
        return [str(x) for x in raw if x]
    return [str(raw)] if raw else []


def build_product(raw: dict[str, Any], attributes: list[str], seed: int = 233) -> Product:
    """One ``items_shuffle`` record (plus its ``items_ins_v2`` attributes) as a ``Product``."""
    asin = str(raw["asin"])
    nouns = raw.get("name_nouns")
    return Product(
        asin=asin,
        title=str(raw.get("name") or ""),
        description=str(raw.get("full_description") or ""),
        bullet_points=_text_list(raw.get("small_description")),
        price=product_price(asin, parse_pricing(raw.get("pricing")), seed),
        product_category=str(raw.get("product_category") or ""),
        category=str(raw.get("category") or ""),
        query=str(raw.get("query") or "").lower().strip(),
        options=_options(raw.get("customization_options")),
        attributes=[str(a) for a in attributes],
        rating=str(raw.get("average_rating") or "N.A."),
        name_nouns=[str(n).lower() for n in nouns] if isinstance(nouns, list) else None,
    )


def price_upper_for(price: float, rng: random.Random) -> float:
    """WebShop's bound: max of two distinct draws from the first four multiples of 10 above ``price``."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_BOUND
    return sorted(rng.sample(candidates, 2))[1]


def build_goals(products: Mapping[str, Product], human: dict[str, Any], seed: int = 233) -> list[Goal]:
    """Human goals for the products present in ``products`` (file order); attribute-less ones are dropped."""
    goals = []
    for asin, instructions in human.items():
        product = products.get(asin)
        if product is None or not isinstance(instructions, list):
            continue
        for i, ins in enumerate(instructions):
            attributes = ins.get("instruction_attributes", ins.get("attributes")) or []
            if not attributes:
                continue
            upper = price_upper_for(product.price, random.Random(f"{seed}:goal:{asin}:{i}"))
            price_text = f", and price lower than {upper:.2f} dollars" if upper < NO_PRICE_BOUND else ""
            options = ins.get("instruction_options") or []
            if isinstance(options, dict):
                options = list(options.values())
            goals.append(
                Goal(
                    asin=asin,
                    category=product.category,
                    query=product.query,
                    name=product.title,
                    product_category=product.product_category,
                    instruction_text=str(ins.get("instruction", "")).strip().strip(".") + price_text,
                    attributes=[str(a) for a in attributes],
                    price_upper=upper,
                    goal_options=[str(o) for o in options],
                    name_nouns=product.name_nouns,
                )
            )
    return goals


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"WebShop data file {str(path)!r} not found; set data_dir / the file names")
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def load_catalog(
    data_dir: str | Path | None = None,
    products_file: str = "items_shuffle.json",
    attributes_file: str = "items_ins_v2.json",
    goals_file: str = "items_human_ins.json",
    seed: int = 233,
) -> Catalog:
    """Read products, attributes and human goals from ``data_dir`` (the shipped small set when None), or the
    converted catalog in ``data_dir`` when it has ``catalog.json`` (the file names and seed are then unused)."""
    root = Path(data_dir).expanduser() if data_dir is not None else SHIPPED_DIR
    if (root / CONVERTED_MANIFEST).is_file():
        return load_converted(root)
    raw_products = _read_json(root / products_file)
    attrs = _read_json(root / attributes_file)
    products: dict[str, Product] = {}
    for raw in raw_products:
        asin = raw.get("asin") if isinstance(raw, dict) else None
        if not asin or asin in products:
            continue
        entry = attrs.get(asin) or {}
        products[asin] = build_product(raw, entry.get("attributes") or [], seed)
    human = _read_json(root / goals_file)
    return Catalog(products=products, goals=build_goals(products, human, seed))


def split_goals(goals: list[Goal], split: str, test_size: int, val_size: int, shuffle_seed: int = 233) -> list[Goal]:
    """Goals of ``split`` after a fixed shuffle: test = first ``test_size``, val = next ``val_size``, train = rest."""
    if split not in SPLITS:
        raise ValueError(f"unknown WebShop split {split!r}; use one of {SPLITS}")
    shuffled = list(goals)
    random.Random(shuffle_seed).shuffle(shuffled)
    bounds = {"test": (0, test_size), "val": (test_size, test_size + val_size)}
    start, end = bounds.get(split, (test_size + val_size, len(shuffled)) if split == "train" else (0, len(shuffled)))
    chosen = shuffled[start:end]
    if not chosen:
        raise ValueError(
            f"WebShop split {split!r} is empty ({len(goals)} goals, test_size={test_size}, val_size={val_size});"
            " lower test_size / val_size"
        )
    return chosen
