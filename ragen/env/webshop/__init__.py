"""WebShop (Yao et al. 2022) as a text environment: WebShop's catalog/goal JSON, BM25 search, text pages,
the published purchase score. Importing this package registers the ``webshop`` env."""

from ragen.env.webshop.data import Catalog, Goal, Product, load_catalog, split_goals
from ragen.env.webshop.env import WebShopEnv
from ragen.env.webshop.scoring import PurchaseScore, make_noun_extractor, purchase_score

__all__ = [
    "Catalog",
    "Goal",
    "Product",
    "PurchaseScore",
    "WebShopEnv",
    "load_catalog",
    "make_noun_extractor",
    "purchase_score",
    "split_goals",
]
