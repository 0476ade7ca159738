"""Oracle protocol helpers: yes/no normalisation, censoring, scripted rule order, the LLM oracle over a fake engine."""

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
from ragen.rollout.base import Engine, Sample


class CharTokenizer:
    """A tiny stand-in tokenizer: one id per character, a plain-text chat template."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


class FixedEngine:
    """Engine that returns the same token ids for every prompt and records what it was asked."""

    def __init__(self, reply: str) -> None:
        self.reply_ids = [ord(c) for c in reply]
        self.calls: list[tuple[list[list[int]], object]] = []

    def generate(self, prompt_token_ids, sampling):
        self.calls.append((prompt_token_ids, sampling))
        return [Sample(list(self.reply_ids), [0.0] * len(self.reply_ids), "stop") for _ in prompt_token_ids]

    def update_weights(self, state_dict) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass


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


def test_llm_oracle_puts_secret_in_prompt_samples_greedily_and_postprocesses():
    engine = FixedEngine(" yes, it is.")
    assert isinstance(engine, Engine)
    tok = CharTokenizer()

    def prompt(question, secret):
        return [{"role": "system", "content": f"secret={secret.name}"}, {"role": "user", "content": question}]

    oracle = LLMOracle(engine, tok, prompt, lambda text, s: normalize_yes_no(text), max_new_tokens=7)
    assert oracle.answer("Is it an animal?", Secret("dog")) == YES
    (prompts, sampling), = engine.calls
    rendered = tok.decode(prompts[0])
    assert rendered == "<system>secret=dog</system><user>Is it an animal?</user><assistant>"
    assert sampling.temperature == 0.0 and sampling.max_new_tokens == 7


def test_llm_oracle_censoring_postprocess():
    engine = FixedEngine("It is Paris, the capital of France.")
    oracle = LLMOracle(engine, CharTokenizer(), lambda q, s: [{"role": "user", "content": q}],
                       lambda text, s: censor(text, s.all_names))
    assert oracle.answer("Where?", Secret("Paris", ("paree",))) == "It is [the city], the capital of France."


def test_llm_oracle_for_model_is_lazy_and_validates_name():
    lazy = llm_oracle_for_model("some-model", lambda q, s: [], lambda t, s: t)
    assert lazy._oracle is None  # nothing is loaded until the first question
    with pytest.raises(ValueError, match="oracle_model"):
        llm_oracle_for_model("  ", lambda q, s: [], lambda t, s: t)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_helpers_never_raise_on_garbage(text):
    assert normalize_yes_no(text) in (YES, NO, INVALID)
    assert isinstance(censor(text, ("Paris", "São Paulo", "")), str)


@pytest.mark.slow
def test_real_default_model_answers_yes_no_or_invalid():
    from ragen.env.twenty_questions import llm_postprocess, llm_prompt

    oracle = llm_oracle_for_model("smollm2-135m-instruct", llm_prompt, llm_postprocess, max_new_tokens=8)
    answer = oracle.answer("Is it an animal?", Secret("dog", ("puppy",)))
    assert answer in (YES, NO, INVALID)
