"""Synthetic WebShop data files in WebShop's ORIGINAL schema (for the converter's tests and bench).

``items_shuffle``: a JSON array of ``{asin, name, full_description, small_description, pricing, product_category,
category, query, customization_options {Name: [{value, image}]}, average_rating, images, product_information}``;
``items_ins_v2``: ``{asin: {attributes, instruction, instruction_attributes}}``; ``items_human_ins``: ``{asin:
[{asin, instruction, instruction_attributes, instruction_options}]}`` for the goal products (every ``goal_every``-th).
Products of a type share a query, a category path and the nouns of their names (``TYPES``); each has 3 attributes
of its type's pool, a colour and a size option. ``write_files`` streams the array out, so it can write 50k+
products without holding them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

# (category, product_category, query, name phrase, attribute pool)
TYPES = [
    ("beauty", "Beauty & Personal Care › Hair Care › Shampoo", "shampoo", "Argan Shampoo",
     ["sulfate free", "paraben free", "dry hair", "long lasting"]),
    ("grocery", "Grocery & Gourmet Food › Beverages › Tea", "green tea", "Green Tea Bags",
     ["gluten free", "non gmo", "caffeine free", "usda organic"]),
    ("fashion", "Clothing, Shoes & Jewelry › Men › Shoes › Running", "running shoes", "Running Shoes",
     ["non slip", "rubber sole", "memory foam", "lace up"]),
    ("furniture", "Home & Kitchen › Furniture › Office Chairs", "office chair", "Office Chair",
     ["lumbar support", "height adjustable", "easy assembly", "mesh back"]),
    ("electronics", "Electronics › Headphones › Earbuds", "wireless earbuds", "Earbuds Headset",
     ["noise cancelling", "charging case", "water resistant", "bluetooth 5.0"]),
]
BRANDS = ["Lumina", "Verdella", "Oakhaven", "Voltix", "Trailmark", "Nutrivo", "Sonora", "Casamia"]
COLORS = ["navy blue", "black", "light grey", "white", "olive green"]
SIZES = ["small", "medium", "large", "x-large"]


def asin_of(i: int) -> str:
    return f"B{i:09d}"


def product(i: int, rng: random.Random) -> tuple[dict, dict]:
    """(items_shuffle record, items_ins_v2 entry) of product ``i``."""
    category, product_category, query, phrase, pool = TYPES[i % len(TYPES)]
    brand, attrs = rng.choice(BRANDS), rng.sample(pool, 3)
    price = round(rng.uniform(8, 120), 2)
    colors, sizes = rng.sample(COLORS, 3), rng.sample(SIZES, 2)
    record = {
        "asin": asin_of(i),
        "name": f"{brand} {phrase} Model {i}",
        "full_description": f"The {brand} {phrase.lower()} is {attrs[1]} and {attrs[2]}. Item {i}.",
        "small_description": [f"{attrs[0].capitalize()} {phrase.lower()}", f"By {brand}"],
        "pricing": f"${price:.2f}" if i % 4 else f"${price:.2f} - ${price * 1.3:.2f}",
        "product_category": product_category,
        "category": category,
        "query": query,
        "average_rating": rng.choice([3.9, 4.2, 4.6]),
        "customization_options": {"Color": [{"value": c, "image": None} for c in colors],
                                  "Size": [{"value": s, "image": None} for s in sizes]},
        "images": [f"https://example.invalid/{i}.jpg"],
        "product_information": {"Brand": brand},
    }
    entry = {"attributes": attrs, "instruction": f"i need {attrs[0]} {query}", "instruction_attributes": attrs[:1]}
    return record, entry


def human_goal(record: dict, entry: dict, rng: random.Random) -> dict:
    """One human instruction for ``record``: its first attribute and one colour and size it is sold in."""
    color = rng.choice(record["customization_options"]["Color"])["value"]
    size = rng.choice(record["customization_options"]["Size"])["value"]
    attr = entry["attributes"][0]
    return {"asin": record["asin"], "instruction": f"i want a {attr} {record['query']} in {color}, size {size}",
            "instruction_attributes": [attr], "instruction_options": [color, size]}


def generate(n: int, seed: int = 0, goal_every: int = 5) -> Iterator[tuple[dict, dict, dict | None]]:
    """(record, attributes entry, human goal or None) for products 0..n-1, in a shuffled order."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    for i in order:
        rng = random.Random(f"{seed}:{i}")
        record, entry = product(i, rng)
        yield record, entry, human_goal(record, entry, rng) if i % goal_every == 0 else None


def write_files(out: str | Path, n: int, seed: int = 0, goal_every: int = 5, duplicates: int = 0) -> dict[str, Path]:
    """Write items_shuffle.json / items_ins_v2.json / items_human_ins.json for ``n`` products into ``out``; the first
    ``duplicates`` records are repeated at the end of the array (WebShop's file has duplicate ASINs)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f"{k}.json" for k in ("items_shuffle", "items_ins_v2", "items_human_ins")}
    human: dict[str, list[dict]] = {}
    repeat: list[dict] = []
    with paths["items_shuffle"].open("w", encoding="utf-8") as items, paths["items_ins_v2"].open("w") as ins:
        items.write("[")
        ins.write("{")
        for k, (record, entry, goal) in enumerate(generate(n, seed, goal_every)):
            items.write(("," if k else "") + "\n" + json.dumps(record, ensure_ascii=False))
            ins.write(("," if k else "") + "\n" + json.dumps(record["asin"]) + ": " + json.dumps(entry))
            if goal is not None:
                human[record["asin"]] = [goal]
            if len(repeat) < duplicates:
                repeat.append(dict(record, name=record["name"] + " (duplicate)"))
        for record in repeat:
            items.write(",\n" + json.dumps(record, ensure_ascii=False))
        items.write("\n]\n")
        ins.write("\n}\n")
    paths["items_human_ins"].write_text(json.dumps(human, indent=1), encoding="utf-8")
    return paths
