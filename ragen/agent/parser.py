"""Parse a model response into actions: ``<think>...</think><answer>a || b</answer>``.

The parser is total: any text (garbage, unclosed tags, unicode, lone surrogates, empty) returns a
``ParsedResponse`` of valid Unicode (:func:`clean_text`) and never raises. A response is well-formed
(``format_ok``) when, apart from surrounding whitespace, it is

* ``<think>T</think> <answer>A</answer>`` when thinking is on (``think=True``), or
* ``<answer>A</answer>``, optionally preceded by one think block, when thinking is off,

where T and A contain no tag of either kind and A holds at least one non-empty action. Actions are A split
on ``action_sep``, stripped, empties dropped (the caller limits how many are executed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache


@dataclass(frozen=True)
class ParsedResponse:
    """What a response asked for: ``actions`` in order, whether the format was respected, and the parts."""

    actions: list[str] = field(default_factory=list)
    format_ok: bool = False
    think: str = ""
    answer: str = ""


@lru_cache(maxsize=64)
def _pattern(think_tag: str, answer_tag: str, think_required: bool) -> re.Pattern[str]:
    t, a = re.escape(think_tag), re.escape(answer_tag)
    think_block = rf"<{t}>(?P<think>.*?)</{t}>\s*"
    think_part = f"(?:{think_block})" + ("" if think_required else "?")
    return re.compile(rf"\A\s*{think_part}<{a}>(?P<answer>.*?)</{a}>\s*\Z", re.DOTALL)


def _has_tag(text: str, tags: tuple[str, ...]) -> bool:
    return any(f"<{tag}>" in text or f"</{tag}>" in text for tag in tags)


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: lone surrogates (``"\\udca0"``: what ``surrogateescape`` decoding or a JSON
    ``\\ud800`` escape from an API engine leaves) become U+FFFD, since they make any later ``encode`` raise
    (tokenizers, bm25, regex engines of envs). Valid text is returned unchanged (and fast)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def split_actions(answer: str, action_sep: str) -> list[str]:
    """``"a || b ||  "`` -> ``["a", "b"]``: split on ``action_sep``, strip, drop empties."""
    if not action_sep:
        parts = [answer]
    else:
        parts = answer.split(action_sep)
    return [p.strip() for p in parts if p.strip()]


def parse_response(
    text: str,
    *,
    think: bool = True,
    think_tag: str = "think",
    answer_tag: str = "answer",
    action_sep: str = "||",
) -> ParsedResponse:
    """Parse ``text`` (the decoded response, special tokens removed); never raises.

    Returns the actions and ``format_ok``. When the format is broken, ``actions`` is empty and ``think`` /
    ``answer`` hold whatever could be recovered (for logging only).
    """
    if not isinstance(text, str):
        return ParsedResponse()
    text = clean_text(text)
    match = _pattern(think_tag, answer_tag, think).match(text)
    if match is None:
        return ParsedResponse(answer=_loose_answer(text, answer_tag))
    think_text = match.group("think") or ""
    answer = match.group("answer")
    tags = (think_tag, answer_tag)
    if _has_tag(think_text, tags) or _has_tag(answer, tags):
        return ParsedResponse(think=think_text.strip(), answer=answer.strip())
    actions = split_actions(answer, action_sep)
    return ParsedResponse(actions=actions, format_ok=bool(actions), think=think_text.strip(), answer=answer.strip())


def _loose_answer(text: str, answer_tag: str) -> str:
    """Best-effort answer text of a malformed response (for logs); '' when there is no answer tag."""
    start = text.find(f"<{answer_tag}>")
    if start < 0:
        return ""
    start += len(answer_tag) + 2
    end = text.find(f"</{answer_tag}>", start)
    return (text[start:] if end < 0 else text[start:end]).strip()
