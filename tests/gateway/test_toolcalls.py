"""Tool-call parsers: hand-written cases, the registry, and a hypothesis fuzz (no text may raise; well-formed calls
round-trip)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.gateway.toolcalls import (
    TOOL_PARSERS,
    HermesParser,
    ToolCallParse,
    call_id,
    parser_name_for_model,
    tool_parser,
)

hermes = HermesParser()


def block(name, args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_two_calls_and_content():
    text = "Let me look.\n" + block("search", {"q": "paris", "k": 3}) + "\n" + block("calc", {"expr": "1+2"})
    p = hermes.parse(text, seed="req-1:0")
    assert not p.malformed and p.raw == text
    assert p.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == [("search", {"q": "paris", "k": 3}),
                                                                         ("calc", {"expr": "1+2"})]
    assert [c.id for c in p.tool_calls] == [call_id("req-1:0", 0), call_id("req-1:0", 1)]
    assert p.tool_calls[0].id != p.tool_calls[1].id
    assert p.openai_tool_calls()[0] == {"id": call_id("req-1:0", 0), "type": "function",
                                        "function": {"name": "search", "arguments": '{"q": "paris", "k": 3}'}}


def test_ids_are_stable_per_seed():
    text = block("f", {})
    assert hermes.parse(text, "a").tool_calls[0].id == hermes.parse(text, "a").tool_calls[0].id
    assert hermes.parse(text, "a").tool_calls[0].id != hermes.parse(text, "b").tool_calls[0].id


def test_plain_text_has_no_calls():
    p = hermes.parse("  just words  ")
    assert p == ToolCallParse(content="  just words  ", raw="  just words  ")


def test_missing_arguments_means_none():
    p = hermes.parse('<tool_call>{"name": "now"}</tool_call>')
    assert not p.malformed and p.tool_calls[0].arguments == "{}"


@pytest.mark.parametrize("text, error", [
    ('<tool_call>{"name": "f", "arguments": {"a": 1}', "<tool_call> without </tool_call>"),
    ('x</tool_call>', "</tool_call> without <tool_call>"),
    ('<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>', "invalid JSON"),
    ('<tool_call>[1, 2]</tool_call>', "not an object"),
    ('<tool_call>{"arguments": {}}</tool_call>', "no function name"),
    ('<tool_call>{"name": "f", "arguments": "a=1"}</tool_call>', "arguments are a JSON str"),
    (block("ok", {}) + '<tool_call>{"name": 3}</tool_call>', "tool call 1: no function name"),
    ("<tool_call>" + "[" * 100_000 + "</tool_call>", "invalid JSON (RecursionError)"),
])
def test_malformed_keeps_raw_text_and_no_calls(text, error):
    p = hermes.parse(text)
    assert p.malformed and p.tool_calls == () and p.content == text == p.raw
    assert error in p.error


def test_non_text_is_malformed_not_an_error():
    assert hermes.parse(None).malformed  # type: ignore[arg-type]
    assert TOOL_PARSERS["none"].parse(None).content == ""  # type: ignore[arg-type]


def test_registry_and_families():
    assert tool_parser("hermes") is TOOL_PARSERS["hermes"]
    assert tool_parser("none").parse(block("f", {})).tool_calls == ()
    with pytest.raises(ValueError, match="hermes"):
        tool_parser("mistral-ish")
    assert parser_name_for_model("Qwen/Qwen2.5-7B-Instruct") == "hermes"
    assert parser_name_for_model("NousResearch/Hermes-3-Llama-3.1-8B") == "hermes"
    assert parser_name_for_model("smollm2-135m-instruct") == "none"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
pieces = st.sampled_from(["<tool_call>", "</tool_call>", "<tool_call", "tool_call>", "{", "}", "[", "]", '"',
                          '"name"', '"arguments"', ":", ",", "\n", " ", "null", "1e400", "\\u", "\ud800", "é",
                          "\U0001f600", '{"name": "f", "arguments": {}}', '{"name": "f", "arguments": [1]}'])
noise = st.one_of(st.text(), st.lists(st.one_of(pieces, st.text(max_size=6)), max_size=30).map("".join))


@st.composite
def calls_text(draw):
    """A well-formed completion: text, then 0-3 calls, each with text around. No tag anywhere else: a closing tag
    inside a call's JSON ends the block in the Hermes format (that call is malformed)."""
    plain = st.text(max_size=20).filter(lambda s: "<tool_call>" not in s and "</tool_call>" not in s)
    args = st.dictionaries(st.text(max_size=8), json_values, max_size=4).filter(lambda a: "tool_call>" not in str(a))
    calls = draw(st.lists(st.tuples(st.text(min_size=1, max_size=12).filter(lambda s: "tool_call>" not in s), args),
                          max_size=3))
    parts = [draw(plain)]
    for name, args in calls:
        parts += [block(name, args), draw(plain)]
    return "".join(parts), calls


@settings(max_examples=6000, deadline=None)
@given(text=noise, cut=st.integers(min_value=0, max_value=400), seed=st.text(max_size=5))
def test_fuzz_noise_never_raises(text, cut, seed):
    for t in (text, text[:cut], text * 3):
        for parser in TOOL_PARSERS.values():
            p = parser.parse(t, seed)
            assert isinstance(p, ToolCallParse) and p.raw == t
            assert p.malformed == bool(p.error)
            if p.malformed:
                assert p.content == t and p.tool_calls == ()
            for c in p.tool_calls:
                assert isinstance(json.loads(c.arguments), dict) and c.arguments.isascii()


@settings(max_examples=4000, deadline=None)
@given(case=calls_text(), cut=st.integers(min_value=0, max_value=200))
def test_fuzz_well_formed_calls_round_trip(case, cut):
    text, calls = case
    p = hermes.parse(text, "s")
    assert not p.malformed, p.error
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == [(n, a) for n, a in calls]
    assert len({c.id for c in p.tool_calls}) == len(calls)
    truncated = hermes.parse(text[:cut], "s")  # a completion cut by the token budget: parsed or flagged, no raise
    assert truncated.malformed == bool(truncated.error)


def test_huge_text():
    text = ("<tool_call>" + '{"name": "f", "arguments": {"x": "' + "é" * 200_000 + '"}}' + "</tool_call>") * 3
    p = hermes.parse(text)
    assert not p.malformed and len(p.tool_calls) == 3
    assert hermes.parse("{" * 300_000 + "<tool_call>" + "}" * 300_000).malformed
