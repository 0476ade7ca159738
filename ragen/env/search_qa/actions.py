"""Parsing search_qa actions, tag well-formedness, and SQuAD-style answer matching.

An action string is classified as (first rule that applies):

1. a **tool turn** if it contains ``<tool>...</tool>`` blocks (every block is one call, its content the
   call's JSON); an opening ``<tool>`` without a closing tag is one call that fails ("unclosed tag");
2. an **answer** if it contains ``<answer>...</answer>`` (the last block's content; *well-formed* when
   there is exactly one block, all tags are balanced and the content is non-empty), or an unclosed
   ``<answer>`` (the text after it; never well-formed);
3. a **tool turn** with one call if the bare text is JSON-looking: starts with ``{`` and mentions ``name``;
4. an **answer** made of the bare text when ``bare_text_is_answer`` (the agent proxy passes the content of
   the model's answer block as the action, so the answer tags were already checked there: the answer is
   well-formed when its own tags, if any, are balanced), else **invalid**. Empty text is always invalid.

Tags are balanced when, scanning ``<t>`` / ``</t>`` for the configured tag names in order, every opening
tag is closed by the same name before any other tag opens (no nesting) and no closing tag is stray.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass

_PUNCTUATION = frozenset(string.punctuation)


@dataclass(frozen=True)
class ParsedAction:
    """``kind`` is "tool", "answer" or "invalid"; ``tool_calls`` holds each call's JSON text (None = unclosed)."""

    kind: str
    tool_calls: tuple[str | None, ...] = ()
    answer: str = ""
    answer_well_formed: bool = False
    reason: str = ""


def tags_balanced(text: str, tags: Iterable[str]) -> bool:
    """True when every ``<t>`` of ``tags`` in ``text`` is closed by ``</t>`` with no nesting or stray closers."""
    names = "|".join(re.escape(t) for t in tags)
    open_tag = None
    for match in re.finditer(rf"<(/?)({names})>", text):
        closing, name = match.group(1) == "/", match.group(2)
        if not closing:
            if open_tag is not None:
                return False
            open_tag = name
        elif open_tag != name:
            return False
        else:
            open_tag = None
    return open_tag is None


def parse_action(
    text: object, tool_tag: str = "tool", answer_tag: str = "answer", bare_text_is_answer: bool = True,
    extra_tags: Iterable[str] = (),
) -> ParsedAction:
    """Classify ``text`` (see the module docstring); never raises."""
    if not isinstance(text, str) or not text.strip():
        return ParsedAction("invalid", reason="empty action")
    tags = [tool_tag, answer_tag, *extra_tags]
    tool_open, answer_open = f"<{tool_tag}>", f"<{answer_tag}>"
    blocks = re.findall(rf"{re.escape(tool_open)}(.*?)</{re.escape(tool_tag)}>", text, re.DOTALL)
    if blocks:
        return ParsedAction("tool", tool_calls=tuple(blocks))
    if tool_open in text:
        return ParsedAction("tool", tool_calls=(None,))
    answers = re.findall(rf"{re.escape(answer_open)}(.*?)</{re.escape(answer_tag)}>", text, re.DOTALL)
    if answers:
        answer = answers[-1].strip()
        well_formed = len(answers) == 1 and bool(answer) and tags_balanced(text, tags)
        return ParsedAction("answer", answer=answer, answer_well_formed=well_formed)
    if answer_open in text:
        return ParsedAction("answer", answer=text.split(answer_open, 1)[1].strip(), answer_well_formed=False)
    bare = text.strip()
    if bare.startswith("{") and "name" in bare:
        return ParsedAction("tool", tool_calls=(bare,))
    if bare_text_is_answer:
        return ParsedAction("answer", answer=bare, answer_well_formed=tags_balanced(text, tags))
    return ParsedAction("invalid", reason=f"expected {tool_open}...</{tool_tag}> or {answer_open}...</{answer_tag}>")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and the articles a/an/the, squeeze whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(answer: str, aliases: Iterable[str]) -> bool:
    """The normalised answer equals some normalised alias."""
    norm = normalize_answer(answer)
    return any(norm == normalize_answer(a) for a in aliases)


def contains_alias(text: str, aliases: Iterable[str]) -> bool:
    """Some non-empty normalised alias occurs in the normalised ``text`` as a whole-word sequence."""
    padded = f" {normalize_answer(text)} "
    return any(norm and f" {norm} " in padded for norm in map(normalize_answer, aliases))
