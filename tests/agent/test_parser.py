"""Response parser: hand-written cases and a hypothesis fuzz (no text may raise)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.agent import ParsedResponse, parse_response


def test_well_formed_with_think():
    p = parse_response("  <think>go right</think>\n<answer> Right || Up ||  </answer>\n")
    assert p == ParsedResponse(actions=["Right", "Up"], format_ok=True, think="go right", answer="Right || Up ||")


def test_think_required_by_default_and_optional_when_off():
    assert not parse_response("<answer>Left</answer>").format_ok
    off = parse_response("<answer>Left</answer>", think=False)
    assert off.format_ok and off.actions == ["Left"]
    both = parse_response("<think>t</think><answer>Left</answer>", think=False)
    assert both.format_ok and both.think == "t"


def test_malformed_cases():
    bad = [
        "",
        "Left",
        "<think>x</think>",
        "<think>x</think><answer>Left",  # unclosed
        "<think>x</think><answer>  ||  </answer>",  # no action
        "<think>x</think><answer>a</answer> trailing",  # text after the answer
        "<think>x <answer>a</answer></think><answer>b</answer>",  # nested tag
        "<think>x</think><answer>a</answer><answer>b</answer>",  # two answers
    ]
    for text in bad:
        p = parse_response(text)
        assert not p.format_ok and p.actions == [], text
    assert parse_response("<think>x</think><answer>Left").answer == "Left"  # best-effort, for logs


def test_custom_tags_and_separator():
    p = parse_response("<r>hm</r><act>a ; b;c</act>", think_tag="r", answer_tag="act", action_sep=";")
    assert p.format_ok and p.actions == ["a", "b", "c"]
    assert not parse_response("<think>hm</think><answer>a</answer>", think_tag="r", answer_tag="act").format_ok


def test_regex_special_tags_are_escaped():
    p = parse_response("<th.nk>x</th.nk><a+>b</a+>", think_tag="th.nk", answer_tag="a+")
    assert p.format_ok and p.actions == ["b"]
    assert not parse_response("<thXnk>x</thXnk><a+>b</a+>", think_tag="th.nk", answer_tag="a+").format_ok


pieces = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "||", " ", "\n", "Left", "<", ">", "/"])
texts = st.one_of(st.text(), st.lists(st.one_of(pieces, st.text(max_size=5)), max_size=20).map("".join))


@settings(max_examples=400, deadline=None)
@given(text=texts, think=st.booleans(), sep=st.sampled_from(["||", ",", ";", "|"]))
def test_fuzz_never_raises_and_is_consistent(text, think, sep):
    p = parse_response(text, think=think, action_sep=sep)
    assert isinstance(p, ParsedResponse)
    assert p.format_ok == bool(p.actions)
    assert all(a == a.strip() and a for a in p.actions)
    if p.format_ok:
        assert "<answer>" in text and "</answer>" in text
        assert sep.join(p.actions).replace(" ", "") in p.answer.replace(" ", "") or len(p.actions) > 1


def test_non_string_input_is_malformed_not_an_error():
    assert parse_response(None) == ParsedResponse()  # type: ignore[arg-type]
