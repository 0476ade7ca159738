"""Generate the small shipped WebShop catalog (ragen/data/webshop) deterministically.

Writes, in WebShop's own JSON formats:
  items_shuffle.json    80 products (5 categories x 4 product types x 4 brands), with precomputed
                        ``name_nouns`` (the nouns of each name are known by construction);
  items_ins_v2.json     {asin: {attributes: [...]}};
  items_human_ins.json  {asin: [{instruction, instruction_attributes, instruction_options}]}: 100 goals
                        in the style of WebShop's human instructions (the price bound is added by the
                        loader, as in WebShop).
Usage: python scripts/make_webshop_data.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

# (category, product_category, query, type phrase, type nouns, attribute pool, options, price range, features)
# features: (text appended to the name, its nouns)
TYPES = [
    ("beauty", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos", "shampoo", "shampoo",
     ["shampoo"], ["sulfate free", "paraben free", "dry hair", "natural ingredients", "long lasting"],
     {"size": ["8 fl oz", "16 fl oz", "32 fl oz"], "scent": ["lavender", "coconut", "unscented"]}, (8, 30),
     [("with Argan Oil", ["argan", "oil"]), ("for Damaged Hair", ["hair"])]),
    ("beauty", "Beauty & Personal Care › Makeup › Lips › Lipstick", "lipstick", "matte lipstick",
     ["lipstick"], ["long lasting", "cruelty free", "vegan", "easy to apply", "high quality"],
     {"color": ["ruby red", "nude pink", "berry purple", "coral"]}, (6, 25),
     [("Lip Color Set", ["lip", "color", "set"]), ("with Vitamin E", ["vitamin"])]),
    ("beauty", "Beauty & Personal Care › Skin Care › Face › Moisturizers", "face moisturizer", "face moisturizer cream",
     ["face", "moisturizer", "cream"],
     ["oil free", "sensitive skin", "fragrance free", "anti aging", "hyaluronic acid"],
     {"size": ["1.7 oz", "3.4 oz"]}, (12, 45), [("for Daily Use", ["use"]), ("with SPF 30", ["spf"])]),
    ("beauty", "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Polish", "nail polish", "gel nail polish",
     ["nail", "polish"], ["non toxic", "quick dry", "long lasting", "glossy finish", "salon quality"],
     {"color": ["classic red", "baby blue", "mint green", "jet black"], "size": ["single bottle", "6 pack"]}, (5, 22),
     [("Kit", ["kit"]), ("for Manicure", ["manicure"])]),
    ("grocery", "Grocery & Gourmet Food › Beverages › Tea › Green Tea", "green tea", "organic green tea",
     ["tea"], ["gluten free", "non gmo", "caffeine free", "usda organic", "individually wrapped"],
     {"flavor name": ["jasmine", "mint", "lemon ginger"], "size": ["20 count", "100 count"]}, (5, 24),
     [("Bags", ["bags"]), ("Loose Leaf Tin", ["leaf", "tin"])]),
    ("grocery", "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars", "protein bar", "protein bars",
     ["protein", "bars"], ["gluten free", "low sugar", "high protein", "keto friendly", "plant based"],
     {"flavor name": ["chocolate peanut butter", "cookie dough", "salted caramel"], "size": ["12 count", "24 count"]},
     (15, 40), [("Variety Pack", ["variety", "pack"]), ("Snack", ["snack"])]),
    ("grocery", "Grocery & Gourmet Food › Beverages › Coffee › Whole Bean Coffee", "coffee beans", "whole bean coffee",
     ["bean", "coffee"], ["medium roast", "dark roast", "fair trade", "single origin", "low acid"],
     {"size": ["12 ounce", "2 pound"]}, (10, 35), [("Bag", ["bag"]), ("from Colombia", ["colombia"])]),
    ("grocery", "Grocery & Gourmet Food › Candy & Chocolate › Chocolate Bars", "dark chocolate", "dark chocolate bar",
     ["chocolate", "bar"], ["dairy free", "sugar free", "fair trade", "72 percent cacao", "non gmo"],
     {"flavor name": ["sea salt", "almond", "orange"], "size": ["3 pack", "12 pack"]}, (4, 28),
     [("Gift Box", ["gift", "box"]), ("Squares", ["squares"])]),
    ("fashion", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running", "running shoes", "running shoes",
     ["running", "shoes"], ["non slip", "rubber sole", "breathable mesh", "lace up", "memory foam"],
     {"color": ["black", "navy blue", "light grey", "white"], "size": ["8", "9", "10", "11"]}, (35, 95),
     [("for Men", ["men"]), ("Sneakers", ["sneakers"])]),
    ("fashion", "Clothing, Shoes & Jewelry › Women › Clothing › Tops & Tees › T-Shirts", "t-shirt", "cotton t-shirt",
     ["cotton", "shirt"], ["machine wash", "short sleeve", "relaxed fit", "100 percent cotton", "crew neck"],
     {"color": ["white", "heather grey", "olive green", "burgundy"], "size": ["small", "medium", "large", "x-large"]},
     (9, 30), [("for Women", ["women"]), ("Tee", ["tee"])]),
    ("fashion", "Clothing, Shoes & Jewelry › Men › Clothing › Jackets & Coats › Rain Jackets", "rain jacket",
     "rain jacket", ["rain", "jacket"], ["water resistant", "hooded", "packable", "zip closure", "lightweight"],
     {"color": ["army green", "black", "yellow"], "size": ["medium", "large", "x-large"]}, (30, 90),
     [("Windbreaker", ["windbreaker"]), ("with Pockets", ["pockets"])]),
    ("fashion", "Clothing, Shoes & Jewelry › Men › Clothing › Socks › Casual Socks", "wool socks", "merino wool socks",
     ["merino", "wool", "socks"], ["moisture wicking", "cushioned", "machine washable", "odor resistant", "warm"],
     {"color": ["charcoal", "navy", "multicolor"], "size": ["medium", "large"]}, (10, 32),
     [("for Hiking", ["hiking"]), ("3 Pairs", ["pairs"])]),
    ("furniture", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs", "office chair",
     "ergonomic office chair", ["office", "chair"], ["lumbar support", "height adjustable", "easy assembly",
     "swivel", "mesh back"], {"color": ["black", "grey", "white"]}, (60, 190),
     [("with Armrests", ["armrests"]), ("Desk Chair", ["desk", "chair"])]),
    ("furniture", "Home & Kitchen › Furniture › Living Room Furniture › Bookcases", "bookshelf", "wooden bookshelf",
     ["bookshelf"], ["easy assembly", "solid wood", "space saving", "storage space", "engineered wood"],
     {"color": ["walnut", "white", "espresso"], "size": ["3 tier", "5 tier"]}, (40, 150),
     [("Bookcase", ["bookcase"]), ("for Living Room", ["living", "room"])]),
    ("furniture", "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables", "coffee table",
     "coffee table", ["coffee", "table"], ["storage space", "easy assembly", "mid century", "metal frame",
     "solid wood"], {"color": ["rustic brown", "black", "natural"]}, (45, 170),
     [("with Shelf", ["shelf"]), ("for Living Room", ["living", "room"])]),
    ("furniture", "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases › Bed Frames", "bed frame",
     "metal bed frame", ["metal", "bed", "frame"], ["heavy duty", "no box spring needed", "easy assembly",
     "under bed storage", "noise free"], {"size": ["twin", "full", "queen", "king"]}, (70, 199),
     [("Platform", ["platform"]), ("with Headboard", ["headboard"])]),
    ("electronics", "Electronics › Headphones, Earbuds & Accessories › Earbuds", "wireless earbuds",
     "wireless earbuds", ["earbuds"], ["noise cancelling", "long battery life", "water resistant",
     "bluetooth 5.0", "charging case"], {"color": ["black", "white", "navy blue"]}, (20, 80),
     [("with Microphone", ["microphone"]), ("Headphones", ["headphones"])]),
    ("electronics", "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases", "phone case", "phone case",
     ["phone", "case"], ["shockproof", "slim fit", "wireless charging compatible", "scratch resistant",
     "raised edges"], {"color": ["clear", "black", "pink", "blue"], "size": ["6.1 inch", "6.7 inch"]}, (8, 25),
     [("Cover", ["cover"]), ("with Kickstand", ["kickstand"])]),
    ("electronics", "Electronics › Computers & Accessories › Cables › USB Cables", "usb cable", "usb c cable",
     ["usb", "cable"], ["fast charging", "nylon braided", "durable", "data transfer", "tangle free"],
     {"size": ["3 ft", "6 ft", "10 ft"], "color": ["black", "white", "red"]}, (6, 20),
     [("Charger Cord", ["charger", "cord"]), ("2 Pack", ["pack"])]),
    ("electronics", "Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
     "bluetooth speaker", "portable bluetooth speaker", ["bluetooth", "speaker"], ["waterproof", "long battery life",
     "stereo sound", "built in microphone", "easy to carry"], {"color": ["black", "blue", "red"]}, (20, 99),
     [("with Bass", ["bass"]), ("for Outdoor Party", ["party"])]),
]
BRANDS = {
    "beauty": ["Lumina", "Verdella", "Rosebay", "Aurelle"],
    "grocery": ["Harvest Hill", "Nutrivo", "Goldleaf", "Cocoria"],
    "fashion": ["Trailmark", "Urbanite", "Northpeak", "Solace"],
    "furniture": ["Oakhaven", "Nordlund", "Casamia", "Loftwell"],
    "electronics": ["Voltix", "Sonora", "Zentek", "Pulsewave"],
}
OPENERS = ["i need", "i am looking for", "i want", "find me", "can you get me", "i'm searching for", "please buy"]
N_GOALS = 100


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))


def _product(rng: random.Random, spec: tuple, brand: str, k: int) -> tuple[dict, list[str]]:
    category, product_category, query, phrase, nouns, pool, options, (lo, hi), features = spec
    attrs = rng.sample(pool, 3)
    feature, feature_nouns = features[k % len(features)]
    name = f"{brand} {attrs[0].title()} {phrase.title()} {feature}"
    price = round(rng.uniform(lo, hi), 2)
    pricing = f"${price:.2f}" if k != 3 else f"${price:.2f} - ${price * 1.3:.2f}"
    sentences = [
        f"The {brand} {phrase} is {attrs[1]} and made for everyday use.",
        f"Customers choose it because it is {attrs[2]}.",
        f"Available in {', '.join(v for vals in options.values() for v in vals)}.",
    ]
    product = {
        "asin": _asin(rng),
        "name": name,
        "name_nouns": [w.lower() for w in brand.split()] + list(nouns) + list(feature_nouns),
        "full_description": " ".join(sentences),
        "small_description": [f"{attrs[0].capitalize()} {phrase}", f"{attrs[1].capitalize()}", f"By {brand}"],
        "pricing": pricing,
        "product_category": product_category,
        "category": category,
        "query": query,
        "average_rating": f"{rng.choice([3.8, 4.1, 4.3, 4.5, 4.7])}",
        "customization_options": {
            n.title(): [{"value": v, "image": None} for v in vals] for n, vals in options.items()
        },
    }
    return product, attrs


def _goal(rng: random.Random, spec: tuple, attrs: list[str]) -> dict:
    query, options = spec[2], spec[6]
    chosen_attrs = attrs[: rng.choice([1, 2])]
    chosen_opts = {n: rng.choice(vals) for n, vals in options.items() if rng.random() < 0.8}
    text = f"{rng.choice(OPENERS)} {' and '.join(chosen_attrs)} {query}"
    if chosen_opts:
        text += " with " + " and ".join(f"{n}: {v}" for n, v in chosen_opts.items())
    options_out = list(chosen_opts.values())
    return {"instruction": text, "instruction_attributes": chosen_attrs, "instruction_options": options_out}


def build(seed: int = 0) -> tuple[list[dict], dict, dict]:
    """(items_shuffle, items_ins_v2, items_human_ins) of the shipped catalog."""
    rng = random.Random(seed)
    products, attributes, pairs = [], {}, []
    for spec in TYPES:
        for k, brand in enumerate(BRANDS[spec[0]]):
            product, attrs = _product(rng, spec, brand, k)
            products.append(product)
            attributes[product["asin"]] = {"attributes": attrs}
            pairs.append((spec, product["asin"], attrs))
    human: dict[str, list] = {}
    for i in range(N_GOALS):
        spec, asin, attrs = pairs[i % len(pairs)] if i < len(pairs) else rng.choice(pairs)
        human.setdefault(asin, []).append(_goal(rng, spec, attrs))
    order = list(range(len(products)))
    rng.shuffle(order)  # "items_shuffle": products in a shuffled order
    return [products[i] for i in order], attributes, human


def main() -> None:
    default_out = Path(__file__).resolve().parents[1] / "ragen" / "data" / "webshop"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    items, ins, human = build()
    for name, obj in (("items_shuffle.json", items), ("items_ins_v2.json", ins), ("items_human_ins.json", human)):
        (args.out / name).write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(items)} products and {sum(map(len, human.values()))} goals to {args.out}")


if __name__ == "__main__":
    main()
