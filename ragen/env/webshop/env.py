"""The WebShop environment (Yao et al. 2022): find and buy the product an instruction asks for.

Observations are WebShop's text pages (``pages.py``), optionally followed by the legal actions.
Actions: ``search[keywords]`` on the search page, ``click[target]`` with a lower-cased target on the
current page (``back to search``, ``next >``, ``< prev``, an ASIN, an option value, ``description`` /
``features`` / ``reviews``, ``buy now``). ``click[buy now]`` ends the episode with the purchase score
(``scoring.py``) as reward; every other step gives 0. Success = score 1.0. Invalid actions leave the
page unchanged and score 0.

``reset(seed)`` plays goal ``seed % len(goals)`` of the configured split, so seeds 0..n-1 cover a split.

Expert (``expert_action``): buy the goal's own product with the best options. On the search page it searches the
first of the instruction, the goal's query and the product title that lists the goal product on the first results
page (``expert_query``, checked with the env's own search engine); on a results page it clicks the goal product,
pages towards it, or goes back to search when it is not among the hits; on another product's page or a detail page
it clicks ``< prev``; on the goal product's page it clicks, one at a time, the option values that match the most
goal options (``expert_options``, WebShop's option matching), then ``buy now``. Its reward is the best purchase
score of the goal product, which is below 1 when the product lacks some goal attribute or option.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re

from ragen.env.base import StepResult, register
from ragen.env.bm25_disk import DiskBM25Index
from ragen.env.webshop import pages
from ragen.env.webshop.data import INDEX_DIR, Catalog, Goal, load_catalog, split_goals
from ragen.env.webshop.pages import PageState, ProductSearch
from ragen.env.webshop.scoring import (
    MATCH_THRESHOLD,
    heuristic_nouns,
    make_noun_extractor,
    normalize_color,
    purchase_score,
    token_set_ratio,
)

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
    if catalog.converted_dir is not None:  # a converted full catalog: its BM25 index was built once, on disk
        index = DiskBM25Index(catalog.converted_dir / INDEX_DIR, key="env.config.data_dir")
        return catalog, ProductSearch.from_index(catalog.products.asins, index)
    return catalog, ProductSearch(list(catalog.products.values()))


DEFAULT_SPACY_MODEL = "en_core_web_sm"


@register("webshop")
class WebShopEnv:
    """WebShop over a catalog in WebShop's JSON formats (the shipped small catalog by default).

    Args:
        data_dir: folder with the three JSON files, or a catalog converted by ``python -m
            ragen_external.webshop.convert`` (full WebShop data, served from disk); None = the shipped catalog.
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

    DEFAULT_MAX_TURN = 10  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

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
        spacy_model: str = DEFAULT_SPACY_MODEL,
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
        if self.nouns is heuristic_nouns and spacy_model != DEFAULT_SPACY_MODEL:
            why = "noun_extractor=heuristic" if noun_extractor == "heuristic" else "spaCy is not installed"
            raise ValueError(f"webshop spacy_model={spacy_model!r} has no effect: the heuristic noun extractor is in "
                             f"use ({why}); install spaCy and the model, or remove spacy_model")
        self.use_precomputed_nouns = use_precomputed_nouns
        self.show_actions = show_actions
        self.instructions = INSTRUCTIONS
        self.goal: Goal | None = None
        self.state = PageState()
        self.done = False
        self._expert_memo: dict[tuple, object] = {}  # expert_query / expert_options per goal (not episode state)

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

    def expert_action(self) -> str:
        """The expert's action on the current page (module docstring); reads the state only."""
        if self.goal is None:
            raise RuntimeError("webshop: call reset(seed) before expert_action()")
        if self.done:
            raise RuntimeError("webshop: the episode is over; expert_action() needs an episode in progress "
                               "(call reset(seed) to start a new one)")
        state, target = self.state, self.goal.asin
        if state.kind == "search":
            return f"search[{self.expert_query()}]"
        if state.kind == "results":
            if target in pages.page_asins(state):
                return f"click[{target.lower()}]"
            if target in state.results:
                page = state.results.index(target) // pages.RESULTS_PER_PAGE + 1
                return f"click[{pages.NEXT if page > state.page_num else pages.PREV}]"
            return f"click[{pages.BACK_TO_SEARCH}]"
        if state.kind == "detail" or state.asin != target:
            return f"click[{pages.PREV}]"
        for name, value in self.expert_options().items():
            if state.options.get(name) != value:
                return f"click[{value}]"
        return f"click[{pages.BUY_NOW}]"

    def expert_query(self) -> str:
        """Search keywords that list the goal product on the first results page (module docstring)."""
        key = ("query", self.goal.asin, self.goal.instruction_text)
        if key not in self._expert_memo:
            product = self.catalog.products[self.goal.asin]
            instruction = re.sub(r",? and price lower than [\d.]+ dollars$", "", self.goal.instruction_text)
            candidates = [instruction, self.goal.query, product.title, self.goal.asin]
            best, best_rank = candidates[0], None
            for query in (re.sub(r"[\[\]]|\|\|", " ", q).strip() for q in candidates):
                if not query:
                    continue
                results = self.search_engine.search(query)
                rank = results.index(self.goal.asin) if self.goal.asin in results else None
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = query, rank
                if best_rank is not None and best_rank < pages.RESULTS_PER_PAGE:
                    break
            self._expert_memo[key] = best
        return self._expert_memo[key]

    def expert_options(self) -> dict[str, str]:
        """Option values of the goal product that together match the most goal options (WebShop's matching:
        colour-normalised token-set ratio > 85); option names no value of which matches any goal option are left
        out. Exhaustive over the matching values (greedy per option name beyond 4096 combinations)."""
        key = ("options", self.goal.asin, tuple(self.goal.goal_options))
        if key not in self._expert_memo:
            product = self.catalog.products[self.goal.asin]
            goals = [normalize_color(g) for g in self.goal.goal_options]
            choices: list[tuple[str, list[tuple[str, frozenset[int]]]]] = []
            for name, values in product.options.items():
                matching = []
                for value in values:
                    if next(n for n, vals in product.options.items() if value in vals) != name:
                        continue  # clicking it would set an earlier option with the same value
                    hits = frozenset(i for i, g in enumerate(goals)
                                     if token_set_ratio(normalize_color(value), g) > MATCH_THRESHOLD)
                    if hits:
                        matching.append((value, hits))
                if matching:
                    choices.append((name, matching))
            size = 1
            for _, matching in choices:
                size *= len(matching)
            if size <= 4096:
                combos = itertools.product(*[matching for _, matching in choices])
                best = max(combos, key=lambda combo: len(frozenset().union(*(h for _, h in combo))), default=())
            else:
                best = tuple(max(matching, key=lambda vh: len(vh[1])) for _, matching in choices)
            self._expert_memo[key] = {name: value for (name, _), (value, _) in zip(choices, best, strict=True)}
        return dict(self._expert_memo[key])

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
