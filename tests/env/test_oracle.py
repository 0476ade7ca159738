"""Oracle protocol helpers: yes/no normalisation, censoring, scripted rule order, the LLM oracle over a fake engine.

``char_tokenizer`` and ``fake_engine`` come from tests/conftest.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.env.oracle import (
    INVALID,
    NO,
    YES,
    LLMOracle,
    Oracle,
    ScriptedOracle,
    Secret,
    censor,
    llm_oracle_for_model,
    normalize_yes_no,
)
from ragen.rollout.base import Engine


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Yes.", YES),
        ("yes, it is an animal", YES),
        ("No", NO),
        ("  no, it isn't.", NO),
        ("Correct!", YES),
        ("I would say yes", YES),
        ("The answer is no.", NO),
        ("well, yes and no", INVALID),
        ("yes and no", YES),
        ("Maybe", INVALID),
        ("", INVALID),
        ("Invalid", INVALID),
        ("Nope", NO),
        # the first word decides, whatever follows
        ("Yes! No!", YES),
        ("No! Yes!", NO),
        ("NO.", NO),
        ("YES", YES),
        ("\n\n  Yes", YES),
        ("**Yes**", YES),
        ("<answer>No</answer>", NO),
        ("\u201cYes\u201d", YES),
        ("yeah", YES),
        ("Yep, a dog", YES),
        ("Right.", YES),
        ("True", YES),
        ("False", NO),
        ("incorrect", NO),
        ("Wrong!", NO),
        # otherwise exactly one kind anywhere in the text
        ("That's wrong", NO),
        ("I'd say yes, definitely", YES),
        ("The statement is correct", YES),
        ("maybe yes maybe no", INVALID),
        ("it is true or false", INVALID),
        # whole words only (after accent folding): prefixes, compounds and lookalikes are not answers
        ("I cannot answer", INVALID),
        ("yes-man", INVALID),
        ("no-one knows", INVALID),
        ("nobody knows", INVALID),
        ("Noted.", INVALID),
        ("yesno", INVALID),
        ("knowledge", INVALID),
        ("S\u00ed", INVALID),
        ("N\u00f6", NO),
        ("   ", INVALID),
        ("?!...", INVALID),
    ],
)
def test_normalize_yes_no(text, expected):
    assert normalize_yes_no(text) == expected


def test_censor_names_aliases_accents_and_whole_words():
    assert censor("It is São Paulo, also spelled Sao Paulo.", ("São Paulo",)) == (
        "It is [the city], also spelled [the city]."
    )
    out = censor("New York City is not New York state; Parisians love Paris.", ("New York City", "new york", "Paris"))
    assert out == "[the city] is not [the city] state; Parisians love [the city]."
    assert censor("nothing here", ("Lima",)) == "nothing here"


def test_scripted_oracle_first_matching_rule_wins_else_default():
    secret = Secret("dog")
    oracle = ScriptedOracle([lambda q, s: None, lambda q, s: f"{s.name}:{q}", lambda q, s: "never"], default="D")
    assert oracle.answer("q", secret) == "dog:q"
    assert ScriptedOracle([lambda q, s: None], default="D").answer("q", secret) == "D"
    assert isinstance(oracle, Oracle)


def test_llm_oracle_puts_secret_in_prompt_samples_greedily_and_postprocesses(char_tokenizer, fake_engine):
    tok = char_tokenizer
    engine = fake_engine.fixed(tok.encode(" yes, it is."))
    assert isinstance(engine, Engine)

    def prompt(question, secret):
        return [{"role": "system", "content": f"secret={secret.name}"}, {"role": "user", "content": question}]

    oracle = LLMOracle(engine, tok, prompt, lambda text, s: normalize_yes_no(text), max_new_tokens=12)
    assert oracle.answer("Is it an animal?", Secret("dog")) == YES
    (prompts, sampling), = engine.calls
    rendered = tok.decode(prompts[0])
    assert rendered == "<system>secret=dog</system><user>Is it an animal?</user><assistant>"
    assert sampling.temperature == 0.0 and sampling.max_new_tokens == 12
    # the answer comes from the sampled text: a "no" reply gives No, and the token budget cuts the reply
    assert LLMOracle(fake_engine.fixed(tok.encode("No, never.")), tok, prompt,
                     lambda text, s: normalize_yes_no(text)).answer("Is it a cat?", Secret("dog")) == NO
    cut = LLMOracle(fake_engine.fixed(tok.encode("maybe... yes")), tok, prompt, lambda text, s: text, max_new_tokens=5)
    assert cut.answer("Is it big?", Secret("dog")) == "maybe"


def test_llm_oracle_censoring_postprocess(char_tokenizer, fake_engine):
    engine = fake_engine.fixed(char_tokenizer.encode("It is Paris, the capital of France."))
    oracle = LLMOracle(engine, char_tokenizer, lambda q, s: [{"role": "user", "content": q}],
                       lambda text, s: censor(text, s.all_names), max_new_tokens=64)
    assert oracle.answer("Where?", Secret("Paris", ("paree",))) == "It is [the city], the capital of France."


def test_llm_oracle_for_model_is_lazy_and_validates_name():
    lazy = llm_oracle_for_model("some-model", lambda q, s: [], lambda t, s: t)
    assert lazy._oracle is None  # nothing is loaded until the first question
    with pytest.raises(ValueError, match="oracle_model"):
        llm_oracle_for_model("  ", lambda q, s: [], lambda t, s: t)


# Sentences built from pieces whose kind is known by construction, so the documented rule gives the answer
# independently of the implementation: the first piece with a word decides if it is a yes/no word, otherwise
# exactly one kind must occur.
_PIECES = {
    YES: ["yes", "Yes,", "YES!", "yeah", "Yep.", "correct", "True", "right", "\u201cyes\u201d"],
    NO: ["no", "No.", "NOPE", "false", "Incorrect!", "wrong", "n\u00f3"],
    INVALID: ["it", "is", "maybe", "Paris", "not", "yes-man", "nobody", "Noted", "yesterday", "know", "42",
              "d\u00e9j\u00e0", "u.s."],
    "": ["", "!", "...", "?", " ", ",", "\n", "**"],
}
_KIND = {piece: kind for kind, pieces in _PIECES.items() for piece in pieces}


def _documented_rule(pieces: list[str]) -> str:
    kinds = [_KIND[p] for p in pieces if _KIND[p]]
    if not kinds:
        return INVALID
    if kinds[0] != INVALID:
        return kinds[0]
    found = {k for k in kinds if k != INVALID}
    return found.pop() if len(found) == 1 else INVALID


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(_KIND)), max_size=8))
def test_normalize_yes_no_follows_the_documented_rule(pieces):
    text = " ".join(pieces)
    assert normalize_yes_no(text) == _documented_rule(pieces), text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_normalize_on_garbage_and_with_a_leading_answer(text):
    assert normalize_yes_no(text) in (YES, NO, INVALID)
    assert normalize_yes_no(f"Yes, {text}") == YES  # a leading yes/no word always decides
    assert normalize_yes_no(f"No. {text}") == NO


_CITY_NAMES = ("New York City", "New York", "S\u00e3o Paulo", "Paris")
_SPELLINGS = {
    "New York City": ["New York City", "new york city", "NEW-YORK city"],
    "New York": ["New York", "new-york", "NEW  YORK"],
    "S\u00e3o Paulo": ["S\u00e3o Paulo", "Sao Paulo", "S\u00c3O-PAULO", "sao\tpaulo"],
    "Paris": ["Paris", "PARIS", "paris"],
}
_FILLERS = ["It", "is", "in", "the", "Parisians", "love", "Yorkshire", "Paulownia", "a", "saopaulo", ",", ".",
            "(big)", "state-of-the-art"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_FILLERS),
                          st.sampled_from([(n, s) for n, ss in _SPELLINGS.items() for s in ss])), max_size=10))
def test_censor_masks_every_spelling_and_keeps_the_rest(pieces):
    text = " ".join(p if isinstance(p, str) else p[1] for p in pieces)
    expected = " ".join(p if isinstance(p, str) else "[the city]" for p in pieces)
    # (no filler is "City", so two adjacent names never form a longer one)
    assert censor(text, _CITY_NAMES) == expected, text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_censor_never_raises_on_garbage(text):
    assert isinstance(censor(text, ("Paris", "S\u00e3o Paulo", "")), str)


def test_real_default_model_answers_yes_no_or_invalid():
    from ragen.env.twenty_questions import llm_postprocess, llm_prompt

    oracle = llm_oracle_for_model("smollm2-135m-instruct", llm_prompt, llm_postprocess, max_new_tokens=8)
    answer = oracle.answer("Is it an animal?", Secret("dog", ("puppy",)))
    assert answer in (YES, NO, INVALID)
