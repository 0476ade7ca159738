"""WebShop purchase score and data loading: hand-checked cases against the published definition."""

import json
import random

import pytest

from ragen.env.webshop.data import (
    NO_PRICE_BOUND,
    Goal,
    Product,
    load_catalog,
    parse_pricing,
    price_upper_for,
    product_price,
    split_goals,
)
from ragen.env.webshop.scoring import (
    heuristic_nouns,
    make_noun_extractor,
    normalize_color,
    options_matched,
    purchase_score,
    token_set_ratio,
    type_reward,
)


def shampoo() -> Product:
    return Product(
        asin="A1", title="Lumina Sulfate Free Shampoo with Argan Oil", description="A gentle wash.",
        bullet_points=["Made for dry hair", "By Lumina"], price=12.0,
        product_category="Beauty › Hair Care › Shampoos", category="beauty", query="shampoo",
        options={"size": ["8 fl oz", "16 fl oz"], "scent": ["lavender", "coconut"]},
        attributes=["sulfate free", "paraben free"], name_nouns=["lumina", "shampoo", "argan", "oil"],
    )


def earbuds() -> Product:
    return Product(
        asin="B2", title="Voltix Wireless Earbuds with Microphone", description="Clear sound.",
        bullet_points=["Charging case"], price=30.0, product_category="Electronics › Audio › Earbuds",
        category="electronics", query="wireless earbuds", options={"color": ["black"]},
        attributes=["noise cancelling"], name_nouns=["voltix", "earbuds", "microphone"],
    )


def shampoo_goal(**kw) -> Goal:
    fields = dict(
        asin="A1", category="beauty", query="shampoo", name="Lumina Sulfate Free Shampoo with Argan Oil",
        product_category="Beauty › Hair Care › Shampoos", instruction_text="i need a sulfate free shampoo",
        attributes=["sulfate free", "dry hair"], price_upper=20.0, goal_options=["16 fl oz", "lavender"],
        name_nouns=["lumina", "shampoo", "argan", "oil"],
    )
    fields.update(kw)
    return Goal(**fields)


def test_exact_match_scores_one():
    score = purchase_score(shampoo(), shampoo_goal(), 12.0, ["16 fl oz", "lavender"])
    # attributes: "sulfate free" fuzzy-matches, "dry hair" is a substring of a bullet point
    assert (score.attributes_matched, score.options_matched, score.price_ok, score.r_type) == (2, 2, True, 1.0)
    assert score.total == 1.0


def test_wrong_option_loses_one_of_five():
    assert token_set_ratio("8 fl oz", "16 fl oz") <= 85  # precondition of the hand computation
    score = purchase_score(shampoo(), shampoo_goal(), 12.0, ["8 fl oz", "lavender"])
    assert score.options_matched == 1
    assert score.total == pytest.approx((2 + 1 + 1) / 5)


def test_over_price_loses_price_point():
    score = purchase_score(shampoo(), shampoo_goal(), 25.0, ["16 fl oz", "lavender"])
    assert not score.price_ok
    assert score.total == pytest.approx(4 / 5)


def test_wrong_type_scores_zero():
    score = purchase_score(earbuds(), shampoo_goal(), 30.0, ["black"])
    assert (score.title_score, score.r_type, score.query_match, score.category_match) == (0.0, 0.0, False, False)
    assert score.total == 0.0


def test_missing_attribute_and_options():
    goal = shampoo_goal(attributes=["sulfate free", "vegan"], goal_options=["lavender"])
    score = purchase_score(shampoo(), goal, 12.0, [])
    assert score.total == pytest.approx((1 + 0 + 1) / 4)


@pytest.mark.parametrize(
    "goal_nouns, product_nouns, query, category, expected_title, expected_r_type",
    [
        (["a", "b", "c", "d", "e"], ["a", "z"], "other", "X › Y", 0.2, 0.5),  # no match of any kind
        (["a", "b", "c", "d", "e"], ["a", "z"], "shampoo", "X › Y", 0.2, 1.0),  # query matches
        (["a", "b", "c", "d", "e"], ["a", "z"], "other", "Beauty › Hair Care", 0.2, 1.0),  # 2 category parts
        (["a"] + list("bcdefghijklmnopqrst"), ["a"], "shampoo", "X › Y", 0.05, 0.1),  # title < 0.1 overrides
        (["oil", "oil", "shampoo"], ["oil"], "other", "X › Y", 1 / 3, 1.0),  # duplicates count in D
        ([], ["oil"], "other", "X › Y", 0.2, 0.5),  # no goal nouns -> 0.2
    ],
)
def test_type_reward_ladder(goal_nouns, product_nouns, query, category, expected_title, expected_r_type):
    product = shampoo()
    product.name_nouns, product.query, product.product_category = product_nouns, query, category
    goal = shampoo_goal(name_nouns=goal_nouns)
    r_type, title, *_ = type_reward(product, goal, heuristic_nouns)
    assert title == pytest.approx(expected_title)
    assert r_type == expected_r_type


def test_colour_normalisation_and_token_set_options():
    assert normalize_color("navy blue") == "blue" and normalize_color("light grey") == "grey"
    assert normalize_color("16 fl oz") == "16 fl oz"
    assert options_matched(["navy blue"], ["blue"]) == 1
    assert token_set_ratio("X-Large", "large") == 100  # lower-cased, "-" -> space, token set contained
    assert options_matched(["x-large"], ["large"]) == 1
    assert options_matched(["black", "large"], ["large", "large"]) == 2  # not one-to-one


def test_heuristic_nouns_and_extractor_choice():
    assert heuristic_nouns("Lumina Sulfate Free Shampoo for Dry Hair, 16 fl oz") == [
        "lumina", "sulfate", "shampoo", "hair",
    ]
    assert make_noun_extractor("heuristic") is heuristic_nouns
    with pytest.raises(ValueError, match="noun_extractor"):
        make_noun_extractor("nltk")


def test_pricing_and_price_bounds():
    assert parse_pricing("$12.99") == [12.99]
    assert parse_pricing("$10.71 - $18.34") == [10.71, 18.34]
    assert parse_pricing("$1,299.00") == [1299.0]
    assert parse_pricing(None) == [100.0] and parse_pricing("") == [100.0]
    drawn = product_price("X", [10.71, 18.34])
    assert 10.71 <= drawn <= 18.34 and drawn == product_price("X", [10.71, 18.34])
    uppers = {price_upper_for(12.99, random.Random(s)) for s in range(50)}
    assert uppers == {30.0, 40.0, 50.0}  # max of two distinct draws from [20, 30, 40, 50]
    assert price_upper_for(985.0, random.Random(0)) == NO_PRICE_BOUND


def _write_catalog(tmp_path):
    products = [
        {"asin": "P1", "name": "Acme Blue Mug", "full_description": "A mug.", "small_description": ["Ceramic"],
         "pricing": "$12.00", "product_category": "Home › Kitchen › Mugs", "category": "home", "query": "Mug",
         "customization_options": {"Color/Size": [{"value": "Blue/Large"}, {"value": "Red"}], "Empty": None}},
        {"asin": "P1", "name": "duplicate", "pricing": "$1"},
        {"asin": "P2", "name": "Acme Plate"},
    ]
    attrs = {"P1": {"attributes": ["dishwasher safe"]}}
    human = {"P1": [{"instruction": "i want a blue mug.", "instruction_attributes": ["dishwasher safe"],
                     "instruction_options": ["blue | large"]},
                    {"instruction": "no attributes", "instruction_attributes": [], "instruction_options": []}],
             "P9": [{"instruction": "unknown product", "instruction_attributes": ["x"]}]}
    for name, obj in (("p.json", products), ("a.json", attrs), ("h.json", human)):
        (tmp_path / name).write_text(json.dumps(obj))


def test_load_catalog_in_webshop_format(tmp_path):
    _write_catalog(tmp_path)
    catalog = load_catalog(tmp_path, "p.json", "a.json", "h.json")
    assert list(catalog.products) == ["P1", "P2"]
    mug = catalog.products["P1"]
    assert mug.options == {"color/size": ["blue | large", "red"]}  # values: "/" -> " | ", lower-cased
    assert (mug.price, mug.query, mug.attributes, mug.bullet_points) == (12.0, "mug", ["dishwasher safe"], ["Ceramic"])
    assert catalog.products["P2"].price == 100.0
    (goal,) = catalog.goals
    assert goal.price_upper in (30.0, 40.0, 50.0)
    assert goal.instruction_text == f"i want a blue mug, and price lower than {goal.price_upper:.2f} dollars"
    assert goal.goal_options == ["blue | large"] and goal.name == "Acme Blue Mug"
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_catalog(tmp_path, "missing.json", "a.json", "h.json")


def test_splits_are_disjoint_fixed_and_sized():
    goals = load_catalog().goals
    test, val, train = (split_goals(goals, s, 20, 20) for s in ("test", "val", "train"))
    assert (len(test), len(val), len(train)) == (20, 20, len(goals) - 40)
    ids = [id(g) for g in test + val + train]
    assert len(set(ids)) == len(goals)
    assert [g.instruction_text for g in split_goals(goals, "test", 20, 20)] == [g.instruction_text for g in test]
    with pytest.raises(ValueError, match="empty"):
        split_goals(goals, "train", 500, 1000)
    with pytest.raises(ValueError, match="unknown WebShop split"):
        split_goals(goals, "dev", 20, 20)
