"""The WebShop environment (Yao et al. 2022): find and buy the product an instruction asks for.

Observations are WebShop's text pages (``pages.py``), optionally followed by the legal actions.
Actions: ``search[keywords]`` on the search page, ``click[target]`` with a lower-cased target on the
current page (``back to search``, ``next >``, ``< prev``, an ASIN, an option value, ``description`` /
``features`` / ``reviews``, ``buy now``). ``click[buy now]`` ends the episode with the purchase score
(``scoring.py``) as reward; every other step gives 0. Success = score 1.0. Invalid actions leave the
page unchanged and score 0.

``reset(seed)`` plays goal ``seed % len(goals)`` of the configured split, so seeds 0..n-1 cover a split.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from ragen.env.base import StepResult, register
from ragen.env.webshop import pages
from ragen.env.webshop.data import Catalog, Goal, load_catalog, split_goals
from ragen.env.webshop.pages import PageState, ProductSearch
from ragen.env.webshop.scoring import make_noun_extractor, purchase_score

_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
SHIPPED_SPLIT_SIZES = (20, 20)  # test, val goals of the shipped catalog
WEBSHOP_SPLIT_SIZES = (500, 1000)

INSTRUCTIONS = (
    "You are shopping in WebShop. Follow the instruction shown on the page and buy the product that best "
    "matches it (type, attributes, options and price). Pages are text with fields separated by [SEP]. "
    "Actions (one per step): search[keywords] on the search page; click[target] for a clickable on the "
    "current page, in lower case: 'back to search', 'next >', '< prev', a product ASIN on a results page, "
    "an option value, 'description', 'features' or 'reviews' on an item page, and 'buy now' to purchase "
    "(this ends the episode; reward = WebShop's purchase score in [0, 1], success = 1.0)."
)


@functools.lru_cache(maxsize=4)
def _load(data_dir, products_file, attributes_file, goals_file, seed) -> tuple[Catalog, ProductSearch]:
    catalog = load_catalog(data_dir, products_file, attributes_file, goals_file, seed)
    if not catalog.products:
        raise ValueError(f"no products in {products_file!r} under {data_dir!r}")
    return catalog, ProductSearch(list(catalog.products.values()))


@register("webshop")
class WebShopEnv:
    """WebShop over a catalog in WebShop's JSON formats (the shipped small catalog by default).

    Args:
        data_dir: folder with the three JSON files; None = the shipped catalog (ragen/data/webshop).
        products_file / attributes_file / goals_file: items_shuffle / items_ins_v2 / items_human_ins
            file names (e.g. items_shuffle_1000.json and items_ins_v2_1000.json for the 1k set).
        split: "train", "val", "test" or "all" goals.
        test_size / val_size: split sizes after the fixed shuffle; None = WebShop's 500 / 1000 for
            user data, 20 / 20 for the shipped catalog.
        shuffle_seed: seed of the fixed goal shuffle and of the price draws (233 as in WebShop).
        noun_extractor: "auto" | "spacy" | "heuristic" (see scoring.py); spacy_model: spaCy model name.
        use_precomputed_nouns: prefer the catalog's ``name_nouns`` lists when present.
        show_actions: append "Available actions: ..." to every observation.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        products_file: str = "items_shuffle.json",
        attributes_file: str = "items_ins_v2.json",
        goals_file: str = "items_human_ins.json",
        split: str = "train",
        test_size: int | None = None,
        val_size: int | None = None,
        shuffle_seed: int = 233,
        noun_extractor: str = "auto",
        spacy_model: str = "en_core_web_sm",
        use_precomputed_nouns: bool = True,
        show_actions: bool = True,
    ):
        self.catalog, self.search_engine = _load(data_dir, products_file, attributes_file, goals_file, shuffle_seed)
        default_test, default_val = SHIPPED_SPLIT_SIZES if data_dir is None else WEBSHOP_SPLIT_SIZES
        self.goals: list[Goal] = split_goals(
            self.catalog.goals,
            split,
            default_test if test_size is None else test_size,
            default_val if val_size is None else val_size,
            shuffle_seed,
        )
        self.nouns = make_noun_extractor(noun_extractor, spacy_model)
        self.use_precomputed_nouns = use_precomputed_nouns
        self.show_actions = show_actions
        self.instructions = INSTRUCTIONS
        self.goal: Goal | None = None
        self.state = PageState()
        self.done = False

    # ----------------------------------------------------------------- protocol
    def reset(self, seed: int) -> str:
        """Start the episode for goal ``seed % len(goals)`` on the search page."""
        self.goal = self.goals[int(seed) % len(self.goals)]
        self.state = PageState()
        self.done = False
        return self._observation()

    def legal_actions(self) -> str:
        """``search[<keywords>]`` on the search page, else the page's ``click[...]`` actions."""
        if self.done:
            return "(episode finished)"
        if self.state.kind == "search":
            return "search[<keywords>]"
        return ", ".join(f"click[{t}]" for t in pages.clickables(self.state, self.catalog.products))

    def step(self, action: str) -> StepResult:
        """Apply one ``search[...]`` / ``click[...]`` action (invalid ones change nothing, reward 0)."""
        if self.goal is None:
            raise RuntimeError("WebShopEnv.step called before reset(seed)")
        if self.done:
            return self._invalid("the episode is over")
        match = _ACTION_RE.match(action) if isinstance(action, str) else None
        if match is None:
            return self._invalid("expected search[keywords] or click[target]")
        verb, arg = match.group(1).lower(), match.group(2).strip()
        if verb == "search":
            return self._search(arg)
        return self._click(arg.lower())

    # ----------------------------------------------------------------- actions
    def _search(self, keywords: str) -> StepResult:
        if self.state.kind != "search":
            return self._invalid("search is only available on the search page; click[back to search] first")
        if not keywords:
            return self._invalid("empty search keywords")
        self.state = PageState(kind="results", query=keywords, results=self.search_engine.search(keywords))
        return self._result(reward=0.0, effective=True)

    def _click(self, target: str) -> StepResult:
        products = self.catalog.products
        if target not in pages.clickables(self.state, products):
            return self._invalid(f"{target!r} is not clickable on this page")
        if target == pages.BUY_NOW:
            return self._buy()
        before = self.state.copy()
        state = self.state
        if target == pages.BACK_TO_SEARCH:
            self.state = PageState()
        elif target == pages.NEXT:
            state.page_num += 1
        elif target == pages.PREV:
            if state.kind == "results":
                state.page_num -= 1
            elif state.kind == "item":
                state.kind, state.asin, state.options = "results", None, {}
            else:
                state.kind, state.detail = "item", None
        elif state.kind == "results":
            asin = next(a for a in pages.page_asins(state) if a.lower() == target)
            state.kind, state.asin, state.options = "item", asin, {}
        elif target in pages.DETAIL_BUTTONS:
            state.kind, state.detail = "detail", target
        else:
            name = next(n for n, vals in products[state.asin].options.items() if target in vals)
            state.options[name] = target
        return self._result(reward=0.0, effective=self.state != before)

    def _buy(self) -> StepResult:
        product = self.catalog.products[self.state.asin]
        score = purchase_score(
            product, self.goal, product.price, self.state.options.values(), self.nouns, self.use_precomputed_nouns
        )
        self.done = True
        info = {"purchased_asin": product.asin, "purchase": dataclasses.asdict(score)}
        observation = f"Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {score.total:.4f}"
        success = score.total >= 1.0 - 1e-9
        return StepResult(observation, float(score.total), True, self._info(True, True, success, **info))

    # ----------------------------------------------------------------- helpers
    def _observation(self) -> str:
        text = pages.render(self.state, self.catalog.products, self.goal.instruction_text)
        return f"{text}\nAvailable actions: {self.legal_actions()}" if self.show_actions else text

    def _info(self, valid: bool, effective: bool, success: bool = False, **extra) -> dict:
        return {"action_is_valid": valid, "action_is_effective": effective, "success": success, **extra}

    def _result(self, reward: float, effective: bool) -> StepResult:
        return StepResult(self._observation(), reward, False, self._info(True, effective))

    def _invalid(self, reason: str) -> StepResult:
        if self.done:
            return StepResult(f"Invalid action: {reason}.", 0.0, True, self._info(False, False))
        return StepResult(f"Invalid action: {reason}.\n{self._observation()}", 0.0, False, self._info(False, False))
