"""ragen_external.webshop: WebShop's original files -> converted catalog folder, checked against the in-memory
loader on the same files, and episodes played and scored on it (WebShop's purchase score, shared/WEBSHOP.md)."""

import dataclasses
import json

import pytest

pytest.importorskip("ijson", reason="the webshop extra is not installed: pip install -e .[webshop]")

from ragen_external.webshop import convert  # noqa: E402
from ragen_external.webshop.sample import write_files  # noqa: E402

import ragen.env as E  # noqa: E402
from ragen.env.webshop.data import LazyProducts, load_catalog  # noqa: E402
from ragen.env.webshop.scoring import heuristic_nouns  # noqa: E402

N = 200


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """200 products (+3 duplicate records) in WebShop's schema, converted by the CLI in chunks of 64."""
    root = tmp_path_factory.mktemp("webshop")
    paths = write_files(root / "raw", N, seed=7, duplicates=3)
    convert.main(["--items", str(paths["items_shuffle"]), "--attrs", str(paths["items_ins_v2"]), "--human",
                  str(paths["items_human_ins"]), "--out", str(root / "conv"), "--nouns", "heuristic",
                  "--chunk-size", "64", "--no-progress"])
    return root / "raw", root / "conv"


def envs(dirs):
    raw, conv = dirs
    common = dict(split="all", noun_extractor="heuristic")
    return E.make("webshop", data_dir=str(conv), **common), E.make("webshop", data_dir=str(raw), **common)


def test_converted_catalog_equals_the_in_memory_one(dirs):
    raw, conv = dirs
    mem, disk = load_catalog(raw), load_catalog(conv)
    assert isinstance(disk.products, LazyProducts) and len(disk.products) == len(mem.products) == N
    assert list(disk.products) == list(mem.products)  # file order; the 3 duplicate ASINs kept once (first record)
    for asin, product in mem.products.items():
        assert disk.products[asin] == dataclasses.replace(product, name_nouns=heuristic_nouns(product.title))
    assert "(duplicate)" not in disk.products[list(mem.products)[0]].title
    assert len(disk.goals) == len(mem.goals) == N // 5
    for got, want in zip(disk.goals, mem.goals, strict=True):
        assert got == dataclasses.replace(want, name_nouns=heuristic_nouns(want.name))
    assert "B999999999" not in disk.products and disk.products.get("B999999999") is None
    manifest = json.loads((conv / "catalog.json").read_text())
    assert (manifest["products"], manifest["duplicates"], manifest["goals"]) == (N, 3, N // 5)


def test_search_is_the_in_memory_search(dirs):
    disk, mem = envs(dirs)
    queries = [g.instruction_text for g in mem.goals[:10]] + ["shampoo navy blue", "mesh back office chair", "model 17"]
    for query in queries:
        results = disk.search_engine.search(query)
        assert results == mem.search_engine.search(query) and len(results) > 0, query


def test_expert_and_scripted_episodes_are_scored(dirs):
    disk, mem = envs(dirs)
    for env in (disk, mem):  # the expert buys the goal product with the goal's options: score 1
        env.reset(3)
        while not env.done:
            result = env.step(env.expert_action())
        assert result.reward == 1.0 and result.info["success"]
    # buy the goal product without choosing options: 1 attribute + 0 of 2 options + price, over 1 + 2 + 1 -> 0.5
    goal = disk.goals[3]
    disk.reset(3)
    disk.step(f"search[{disk.expert_query()}]")
    disk.step(f"click[{goal.asin.lower()}]")
    result = disk.step("click[buy now]")
    assert (result.reward, result.info["purchase"]["r_type"], result.info["purchase"]["options_matched"]) == (
        0.5, 1.0, 0)
    # a product of another type and brand: its name shares only "model" with the goal's 4 nouns -> title 0.25,
    # r_type 1 (title > 0.2); no goal attribute, no option; score = [price ok] / 4
    disk.reset(3)
    goal_product = disk.catalog.products[goal.asin]
    disk.step("search[mesh back office chair lumbar support]")
    other = next(disk.catalog.products[a] for a in disk.state.results
                 if disk.catalog.products[a].query != goal.query
                 and disk.catalog.products[a].title.split()[0] != goal_product.title.split()[0]
                 and a in disk.state.results[:10])
    disk.step(f"click[{other.asin.lower()}]")
    purchase = disk.step("click[buy now]").info["purchase"]
    price_ok = other.price <= goal.price_upper
    assert (purchase["title_score"], purchase["r_type"], purchase["attributes_matched"]) == (0.25, 1.0, 0)
    assert purchase["total"] == pytest.approx(int(price_ok) / 4)


def test_same_actions_same_observations_and_rewards(dirs):
    disk, mem = envs(dirs)
    for seed in (0, 11):
        assert disk.reset(seed) == mem.reset(seed)
        while not mem.done:
            action = mem.expert_action()
            a, b = disk.step(action), mem.step(action)
            assert (a.observation, a.reward, a.done) == (b.observation, b.reward, b.done), action


def test_limit_and_bad_folders(dirs, tmp_path):
    raw, _ = dirs
    stats = convert.convert(raw / "items_shuffle.json", raw / "items_ins_v2.json", raw / "items_human_ins.json",
                            tmp_path / "small", nouns="heuristic", limit=50, progress=False)
    small = load_catalog(tmp_path / "small")
    assert stats.products == len(small.products) == 50 and stats.goals == len(small.goals)
    assert {g.asin for g in small.goals} <= set(small.products)
    manifest = tmp_path / "small" / "catalog.json"
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), version=99)))
    with pytest.raises(ValueError, match="convert again"):
        load_catalog(tmp_path / "small")
    with pytest.raises(FileNotFoundError, match="--attrs"):
        convert.convert(raw / "items_shuffle.json", tmp_path / "nope.json", raw / "items_human_ins.json",
                        tmp_path / "x", progress=False)


def test_shipped_default_is_unchanged():
    env = E.make("webshop", noun_extractor="heuristic")  # heuristic: importing spaCy alone takes seconds
    assert len(env.catalog.products) == 80 and isinstance(env.catalog.products, dict)
