"""search_qa: tool-using question answering over a BM25 corpus with step and outcome rewards.
Importing this package registers the ``search_qa`` env."""

from ragen.env.search_qa.actions import ParsedAction, contains_alias, exact_match, normalize_answer, parse_action
from ragen.env.search_qa.data import Passage, QAItem, load_corpus, load_qa
from ragen.env.search_qa.env import SearchQAEnv

__all__ = [
    "ParsedAction",
    "Passage",
    "QAItem",
    "SearchQAEnv",
    "contains_alias",
    "exact_match",
    "load_corpus",
    "load_qa",
    "normalize_answer",
    "parse_action",
]
