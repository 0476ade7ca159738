"""WebShop's text-mode pages, the clickable targets on each, and the product search engine.

A page is its visible strings joined with ``" [SEP] "`` (WebShop's ``text`` observation mode):

* search:  ``WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search``
* results: ``Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] Page k (Total results: N)
  [SEP] < Prev [SEP] Next > [SEP] {ASIN} [SEP] {Title} [SEP] ${price} ...`` (10 per page of the top 50
  hits; ``< Prev`` only after page 1, ``Next >`` only when a later page exists);
* item:    ``Instruction: [SEP] ... [SEP] Back to Search [SEP] < Prev [SEP] {option name} [SEP] {values..}
  [SEP] {Title} [SEP] Price: ${price} [SEP] Rating: {rating} [SEP] Description [SEP] Features
  [SEP] Reviews [SEP] Buy Now``;
* detail (after clicking Description / Features / Reviews): ``Instruction: [SEP] ... [SEP] Back to
  Search [SEP] < Prev [SEP] {text}``.

Click targets are lower-cased: buttons, an ASIN on a results page, an option value on an item page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ragen.env.bm25 import BM25Index
from ragen.env.bm25_disk import DiskBM25Index
from ragen.env.webshop.data import Product

SEP = " [SEP] "
RESULTS_PER_PAGE = 10
MAX_HITS = 50
BACK_TO_SEARCH, PREV, NEXT, BUY_NOW = "back to search", "< prev", "next >", "buy now"
DETAIL_BUTTONS = ("description", "features", "reviews")


class ProductSearch:
    """BM25 over each product's title, description, first bullet point and option values.

    Built in memory from ``products``, or (``from_index``) over a prebuilt disk index whose document i is the
    product with ASIN ``asins[i]`` (a converted catalog)."""

    def __init__(self, products: list[Product]):
        self.asins: Sequence[str] = [p.asin for p in products]
        self.index: BM25Index | DiskBM25Index = BM25Index([self.document(p) for p in products])

    @classmethod
    def from_index(cls, asins: Sequence[str], index: DiskBM25Index) -> ProductSearch:
        if len(asins) != index.size:
            raise ValueError(f"the product index has {index.size} documents for {len(asins)} products; convert again")
        engine = cls.__new__(cls)
        engine.asins, engine.index = asins, index
        return engine

    @staticmethod
    def document(product: Product) -> str:
        """The indexed text of ``product`` (lower-cased)."""
        first_bullet = product.bullet_points[0] if product.bullet_points else ""
        options = ", ".join(f"{name}: {', '.join(values)}" for name, values in product.options.items())
        return " ".join([product.title, product.description, first_bullet, options]).lower()

    def search(self, query: str, k: int = MAX_HITS) -> list[str]:
        """ASINs of the top ``k`` hits for ``query``, best first."""
        return [str(self.asins[hit.index]) for hit in self.index.search(query.lower(), k)]


@dataclass
class PageState:
    """Where the shopper is: ``kind`` in search / results / item / detail, plus what that page needs."""

    kind: str = "search"
    query: str = ""
    results: list[str] = field(default_factory=list)
    page_num: int = 1
    asin: str | None = None
    detail: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    def copy(self) -> PageState:
        return PageState(
            self.kind, self.query, list(self.results), self.page_num, self.asin, self.detail, dict(self.options)
        )


def num_pages(state: PageState) -> int:
    return max(1, -(-len(state.results) // RESULTS_PER_PAGE))


def page_asins(state: PageState) -> list[str]:
    start = (state.page_num - 1) * RESULTS_PER_PAGE
    return state.results[start : start + RESULTS_PER_PAGE]


def format_price(price: float) -> str:
    return f"${price:.2f}"


def clickables(state: PageState, products: Mapping[str, Product]) -> list[str]:
    """The lower-cased click targets of the current page, in page order."""
    if state.kind == "results":
        buttons = [BACK_TO_SEARCH]
        buttons += [PREV] if state.page_num > 1 else []
        buttons += [NEXT] if state.page_num < num_pages(state) else []
        return buttons + [asin.lower() for asin in page_asins(state)]
    if state.kind == "item":
        product = products[state.asin]
        values = [v for vals in product.options.values() for v in vals]
        return [BACK_TO_SEARCH, PREV, *values, *DETAIL_BUTTONS, BUY_NOW]
    if state.kind == "detail":
        return [BACK_TO_SEARCH, PREV]
    return []


def _detail_text(product: Product, detail: str) -> str:
    if detail == "description":
        return product.description or "N.A."
    if detail == "features":
        return SEP.join(product.bullet_points) or "N.A."
    return "N.A."


def render(state: PageState, products: Mapping[str, Product], instruction: str) -> str:
    """The text of the current page (see the module docstring for the grammar)."""
    if state.kind == "search":
        return SEP.join(["WebShop", "Instruction:", instruction, "Search"])
    head = ["Instruction:", instruction, "Back to Search"]
    if state.kind == "results":
        parts = head + [f"Page {state.page_num} (Total results: {len(state.results)})"]
        parts += ["< Prev"] if state.page_num > 1 else []
        parts += ["Next >"] if state.page_num < num_pages(state) else []
        for asin in page_asins(state):
            product = products[asin]
            parts += [asin, product.title, format_price(product.price)]
        return SEP.join(parts)
    product = products[state.asin]
    if state.kind == "detail":
        return SEP.join(head + ["< Prev", _detail_text(product, state.detail or "")])
    parts = head + ["< Prev"]
    for name, values in product.options.items():
        parts += [name, *values]
    parts += [product.title, f"Price: {format_price(product.price)}", f"Rating: {product.rating}"]
    return SEP.join(parts + ["Description", "Features", "Reviews", "Buy Now"])
