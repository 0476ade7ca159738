"""Earlier turns' thinking, cut from later prompts (``agent.history_thinking=strip``).

Chat templates of reasoning models render an earlier assistant message without its thinking: Qwen3 renders
``content.split('</think>')[-1].lstrip('\\n')`` for the assistant turns before the last user message (DeepSeek-R1
and QwQ alike), so at deployment a model never sees its own earlier thinking. The proxy builds prompts from token
ids (``ragen.agent.context``: the next prompt continues the previous one), so it cuts the same part off the ids: the
leading ids of the assistant message (the forced response prefix and the sampled ids) up to and including the last
closing think tag, and the newline-only tokens right after it. The rest of the message keeps its sampled ids.

The cut point is found without re-tokenising text: the message is decoded once, the last closing tag located in the
text, and the token boundary at which the decoded prefix ends right after it found by decoding prefixes (a binary
search over prefix lengths; a tag spelled by several tokens, ``</`` ``think`` ``>``, is found like a single-token one).
When no token boundary falls there (a token holds the end of the tag and the next text, e.g. SmolLM2's ``><`` in
``</think><answer>``) the message is kept whole, since any cut would change the text around the answer; the proxy
counts such turns (``agent/think_kept_unaligned``). Tokenizers with the think tags as single tokens (Qwen3,
DeepSeek-R1, QwQ) always cut exactly, and the stripped prompt is then what their template renders.
"""

from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int]], str]


def _boundary(decode: Decode, ids: list[int], text: str, end: int) -> int | None:
    """The number of leading ``ids`` whose decoded text is exactly ``text[:end]``, or None when no token boundary
    falls at character ``end`` (``text`` = ``decode(ids)``)."""
    lo, hi = 0, len(ids)
    while lo < hi:  # the shortest prefix that decodes to at least ``end`` characters
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo if decode(ids[:lo]) == text[:end] else None


def think_cut(decode: Decode, ids: list[int], close_tag: str) -> int | None:
    """How many leading ``ids`` of an assistant message to drop so that the rest is the message as a reasoning
    model's template renders an earlier turn (module docstring): 0 when the message has no ``close_tag``; None
    when the tag (or the newlines after it) does not end on a token boundary (keep the message whole).

    ``decode``: ids -> text with special tokens kept (``tokenizer.decode(ids, skip_special_tokens=False)``);
    ``ids``: the message's ids, forced response prefix first; ``close_tag``: e.g. ``"</think>"``.
    """
    text = decode(ids)
    pos = text.rfind(close_tag)
    if pos < 0:
        return 0
    end = pos + len(close_tag)
    rest = text[end:]
    end += len(rest) - len(rest.lstrip("\n"))
    return _boundary(decode, ids, text, end)
