"""WebShop's purchase score (Yao et al. 2022, "WebShop", Sec. 3.1 and its reward code), reimplemented.

score = r_type * (n_attributes_matched + n_options_matched + [price <= price_upper])
              / (len(goal.attributes) + len(goal.goal_options) + 1)                     in [0, 1]

* r_type from query match, category match (>= 2 shared "›" parts) and the title score: the share of the
  goal name's nouns (a list; duplicates count) found among the purchased name's nouns (0.2 when the goal
  has none). r_type = 1, -> 0.5 if no match of any kind (title score <= 0.2), -> 0.1 if title < 0.1,
  -> 0 if title == 0 (later rules override earlier ones).
* an attribute matches when some product attribute has ``token_set_ratio > 85`` with it, or it is a
  substring of the lower-cased title, bullet points or description;
* an option matches when some purchased option value (both colour-normalised) has ratio > 85 with it.

Nouns: the original tags the names with a spaCy English model. Here extraction is pluggable
(``make_noun_extractor``): ``spacy`` needs spaCy and a model; ``heuristic`` (the fallback) keeps every
alphabetic word of >= 2 letters that is not a stop word, a number/unit word or a listed common
adjective/descriptor, and does not end in "ly". Catalogs may carry precomputed ``name_nouns``
(the shipped one does); those take precedence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rapidfuzz import fuzz, utils

from ragen.env.webshop.data import Goal, Product

NounExtractor = Callable[[str], list[str]]
MATCH_THRESHOLD = 85

# A value becomes the first of these that is a substring of it (WebShop's colour normalisation).
COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy "
    "camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral "
    "cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass "
    "gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon "
    "mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter "
    "pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone "
    "stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow"
).split()

_STOPWORDS = set(
    "a an the and or of for to in on with without by from at as is are be it its this that these those "
    "your you our we my me i he she they them his her their not no nor so than too very can will just "
    "into over under up down out off per via each all any both more most other some such only own same".split()
)
_NON_NOUNS = set(
    "new best great premium natural organic original classic extra super ultra mini large small medium big "
    "long short high low soft hard light heavy dark bright clean fresh pure free strong durable portable "
    "adjustable waterproof wireless comfortable lightweight compact modern vintage professional full half "
    "double single multi non anti easy quick fast slow hot cold warm cool dry wet thick thin wide narrow "
    "oz fl ml mg lb lbs kg cm mm inch inches ft count pcs pc pack set ct one two three four five six ten "
    "men women mens womens unisex black white red blue green pink gray grey brown".split()
)


def heuristic_nouns(text: str) -> list[str]:
    """Noun-like words of ``text`` (lower-cased, in order, duplicates kept); see the module docstring."""
    words = re.findall(r"[a-z]+", text.lower())
    return [w for w in words if len(w) >= 2 and w not in _STOPWORDS and w not in _NON_NOUNS and not w.endswith("ly")]


def spacy_noun_extractor(model: str = "en_core_web_sm") -> NounExtractor | None:
    """Nouns and proper nouns by spaCy's tagger, or None when spaCy or ``model`` is not installed."""
    try:
        import spacy  # noqa: PLC0415 - optional dependency

        nlp = spacy.load(model)
    except (ImportError, OSError):
        return None

    def extract(text: str) -> list[str]:
        return [t.text.lower() for t in nlp(text) if t.pos_ in ("NOUN", "PROPN")]

    return extract


def make_noun_extractor(kind: str = "auto", spacy_model: str = "en_core_web_sm") -> NounExtractor:
    """``auto`` (spaCy when available, else heuristic), ``spacy`` (required) or ``heuristic``."""
    if kind not in ("auto", "spacy", "heuristic"):
        raise ValueError(f"unknown noun_extractor {kind!r}; use 'auto', 'spacy' or 'heuristic'")
    if kind == "heuristic":
        return heuristic_nouns
    extractor = spacy_noun_extractor(spacy_model)
    if extractor is None and kind == "spacy":
        raise ValueError(f"noun_extractor='spacy' needs spaCy and model {spacy_model!r}; install them or use 'auto'")
    return extractor or heuristic_nouns


def token_set_ratio(a: str, b: str) -> float:
    """thefuzz-style token-set ratio: rapidfuzz's, with its default preprocessing (lower-case, non-word -> space)."""
    return fuzz.token_set_ratio(a, b, processor=utils.default_process)


def normalize_color(value: str) -> str:
    """The first colour of ``COLOR_SET`` contained in ``value``, else ``value`` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def _category_parts(product_category: str) -> set[str]:
    return {part.strip() for part in product_category.split("›") if part.strip()}


@dataclass(frozen=True)
class PurchaseScore:
    """The score and its parts (for logging and tests)."""

    total: float
    r_type: float
    title_score: float
    query_match: bool
    category_match: bool
    attributes_matched: int
    options_matched: int
    price_ok: bool


def type_reward(product: Product, goal: Goal, nouns: NounExtractor, use_precomputed: bool = True) -> tuple:
    """(r_type, title_score, query_match, category_match) as defined in the module docstring."""
    query_match = product.query == goal.query
    category_match = len(_category_parts(product.product_category) & _category_parts(goal.product_category)) >= 2
    desired = goal.name_nouns if use_precomputed and goal.name_nouns is not None else nouns(goal.name)
    bought = product.name_nouns if use_precomputed and product.name_nouns is not None else nouns(product.title)
    title = 0.2 if not desired else len(set(bought) & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title > 0.2):
        r_type = 0.5
    if title < 0.1:
        r_type = 0.1
    if title == 0.0:
        r_type = 0.0
    return r_type, title, query_match, category_match


def attributes_matched(product: Product, goal_attributes: Iterable[str]) -> int:
    """How many goal attributes the product has (fuzzy attribute match or substring of its texts)."""
    texts = (product.title.lower(), " ".join(product.bullet_points).lower(), product.description.lower())
    count = 0
    for goal_attr in goal_attributes:
        fuzzy = any(token_set_ratio(p, goal_attr) > MATCH_THRESHOLD for p in product.attributes)
        if fuzzy or any(goal_attr in text for text in texts):
            count += 1
    return count


def options_matched(purchased: Iterable[str], goal_options: Iterable[str]) -> int:
    """How many goal options some purchased option value matches (colour-normalised, not one-to-one)."""
    bought = [normalize_color(o) for o in purchased]
    return sum(
        any(token_set_ratio(p, g) > MATCH_THRESHOLD for p in bought) for g in map(normalize_color, goal_options)
    )


def purchase_score(
    product: Product,
    goal: Goal,
    price: float,
    purchased_options: Iterable[str],
    nouns: NounExtractor = heuristic_nouns,
    use_precomputed_nouns: bool = True,
) -> PurchaseScore:
    """WebShop's reward for buying ``product`` at ``price`` with the option values ``purchased_options``."""
    r_type, title, query_match, category_match = type_reward(product, goal, nouns, use_precomputed_nouns)
    n_attr = attributes_matched(product, goal.attributes)
    n_opt = options_matched(list(purchased_options), goal.goal_options)
    price_ok = price <= goal.price_upper
    denominator = len(goal.attributes) + len(goal.goal_options) + 1
    total = r_type * (n_attr + n_opt + int(price_ok)) / denominator
    return PurchaseScore(total, r_type, title, query_match, category_match, n_attr, n_opt, price_ok)
