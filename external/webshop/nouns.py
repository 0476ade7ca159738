"""Name nouns for a chunk of product titles at once (the converter's batched form of the env's noun extractor).

The env's extractor (``ragen.env.webshop.scoring.make_noun_extractor``) tags one title per call:
``[t.text.lower() for t in nlp(title) if t.pos_ in ("NOUN", "PROPN")]`` with spaCy, else ``heuristic_nouns``.
Over 1.18M titles that is 1.18M pipeline calls through every component. Here the same words come from
``nlp.pipe(titles, batch_size=...)`` with the components that do not set ``Token.pos_`` disabled (the
dependency parser, the entity recogniser, the lemmatiser, ...): spaCy's English pipelines tag with
``tok2vec``/``transformer`` + ``tagger`` + ``attribute_ruler`` (tag -> POS), which stay on, so each title's nouns are
the ones the env's per-title extractor gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragen.env.webshop.scoring import heuristic_nouns

BatchNouns = Callable[[list[str]], list[list[str]]]
NOUN_POS = ("NOUN", "PROPN")
# components of spaCy pipelines that do not set Token.pos_ (disabled while tagging titles)
UNNEEDED_PIPES = ("parser", "ner", "lemmatizer", "senter", "entity_ruler", "entity_linker", "textcat",
                  "textcat_multilabel", "spancat", "trainable_lemmatizer")


def load_spacy(model: str) -> Any | None:
    """spaCy pipeline ``model``, or None when spaCy or the model is not installed (as the env's extractor)."""
    try:
        import spacy  # noqa: PLC0415 - optional dependency

        return spacy.load(model)
    except (ImportError, OSError):
        return None


def spacy_batch_nouns(nlp: Any, batch_size: int = 256) -> BatchNouns:
    """Nouns and proper nouns of each title, tagged ``batch_size`` titles at a time by ``nlp.pipe``."""
    disable = [name for name in nlp.pipe_names if name in UNNEEDED_PIPES]

    def extract(titles: list[str]) -> list[list[str]]:
        docs = nlp.pipe(titles, batch_size=batch_size, disable=disable)
        return [[t.text.lower() for t in doc if t.pos_ in NOUN_POS] for doc in docs]

    return extract


def heuristic_batch_nouns(titles: list[str]) -> list[list[str]]:
    """``heuristic_nouns`` of each title."""
    return [heuristic_nouns(t) for t in titles]


def make_batch_noun_extractor(kind: str = "auto", spacy_model: str = "en_core_web_sm",
                              batch_size: int = 256) -> tuple[BatchNouns, str]:
    """(extractor, name for the manifest): ``auto`` (spaCy when ``spacy_model`` loads, else the heuristic),
    ``spacy`` (required) or ``heuristic``, the choices of the env's ``make_noun_extractor``."""
    if kind not in ("auto", "spacy", "heuristic"):
        raise ValueError(f"unknown noun extractor {kind!r}; use 'auto', 'spacy' or 'heuristic'")
    if kind == "heuristic":
        return heuristic_batch_nouns, "heuristic"
    nlp = load_spacy(spacy_model)
    if nlp is None:
        if kind == "spacy":
            raise ValueError(f"--nouns spacy needs spaCy and model {spacy_model!r}; install them or use auto")
        return heuristic_batch_nouns, "heuristic"
    return spacy_batch_nouns(nlp, batch_size), f"spacy:{spacy_model}"
