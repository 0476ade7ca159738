"""ChatFormat derivation from a chat template and its error on templates that cannot be built incrementally."""

from __future__ import annotations

import pytest
from agent_helpers import make_char_tokenizer

from ragen.agent import ChatFormat
from ragen.agent.context import EpisodeContext


def test_derived_tokens_and_renderings(char_tok):
    fmt = ChatFormat(char_tok, system_prompt="Be brief.")
    assert fmt.eot_id == char_tok.convert_tokens_to_ids("<|end|>")
    assert char_tok.decode(fmt.separator_ids) == "\n"
    assert char_tok.decode(fmt.first_prompt("hi")) == "<s><|system|>Be brief.<|end|>\n<|user|>hi<|end|>\n<|assistant|>"
    assert char_tok.decode(fmt.next_message("yo")) == "<|user|>yo<|end|>\n<|assistant|>"
    assert len(fmt.next_message("yo")) == 6  # <|user|> y o <|end|> \n <|assistant|>
    assert fmt.decode(fmt.encode("a<|end|>")) == "a"


def test_template_without_end_token_falls_back_to_eos():
    tok = make_char_tokenizer()
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }};{% endfor %}"
    fmt = ChatFormat(tok)
    assert fmt.eot_id == tok.eos_token_id and tok.decode(fmt.separator_ids) == ";"


def test_unstable_template_and_missing_template_errors():
    tok = make_char_tokenizer()
    tok.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}<|end|>{% endfor %}"
    with pytest.raises(ValueError, match="re-renders earlier messages"):
        ChatFormat(tok).next_message("x")
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(tok)


def _episode(tok, turns: int, response: str = "ok") -> EpisodeContext:
    """An episode context after ``turns`` generated turns, with the next user message added."""
    fmt = ChatFormat(tok)
    ctx = EpisodeContext(fmt, "Rules.")
    ctx.add_user("obs 0")
    for k in range(turns):
        ids = fmt.encode(response) + [fmt.eot_id]
        ctx.add_response(ids, [-0.5] * len(ids))
        ctx.add_user(f"obs {k + 1}")
    return ctx


@pytest.mark.parametrize("k", [0, 1, 2])
def test_plan_drops_none_some_or_all_history(char_tok, k):
    """Turn k's prompt: the full row when it fits, else the fewest oldest turns dropped; a history-free prompt
    (``head(k)``) when nothing else fits, with the response budget shrunk (< 1: the caller ends the episode)."""
    new = 8
    ctx = _episode(char_tok, k)
    full = ctx.plan(None, len(ctx.ids) + new, new)  # drop none: exactly fits
    assert (full.ids, full.start_turn, full.truncated, full.max_new_tokens) == (ctx.ids, 0, False, new)
    if k == 2:  # drop some: turn 0 goes, turn 1's exact tokens stay after a fresh first message
        kept = ctx.head(1) + ctx.ids[ctx.turn_starts[1]:]
        some = ctx.plan(None, len(kept) + new, new)
        assert (some.ids, some.start_turn, some.truncated, some.max_new_tokens) == (kept, 1, True, new)
    fresh = ctx.head(k)  # drop all: only the latest observation (k = 0: the episode start itself)
    assert fresh == ctx.ids if k == 0 else len(fresh) < len(ctx.ids)
    tight = ctx.plan(None, len(fresh) + new, new)
    assert (tight.ids, tight.start_turn, tight.truncated, tight.max_new_tokens) == (fresh, k, k > 0, new)
    over = ctx.plan(None, len(fresh) + 3, new)  # even the history-free prompt leaves only 3 tokens
    assert (over.ids, over.start_turn, over.max_new_tokens) == (fresh, k, 3)
    assert ctx.plan(None, len(fresh), new).max_new_tokens < 1
    window = ctx.plan(0, 10_000, new)  # a window of 0 keeps no history, and that is not a truncation
    assert (window.ids, window.start_turn, window.truncated) == (fresh, k, False)


def test_plan_does_not_flag_history_cut_by_itself(char_tok):
    """Only a prompt that is used cuts the history: ``use_plan`` records it, a plan that overflows does not."""
    ctx = _episode(char_tok, 1)
    plan = ctx.plan(0, 10_000, 8)
    assert not ctx.history_cut and ctx.turn_prompts == []
    ctx.use_plan(plan)
    assert ctx.history_cut and ctx.turn_prompts == [plan.ids]
