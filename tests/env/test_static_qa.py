"""Static QA: answer extraction, normalised matching, attempt rewards 1/2^k, data loading."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.base import REQUIRED_INFO_KEYS
from ragen.env.static_qa import answers_match, extract_answer, parse_number


@pytest.mark.parametrize(
    "text, fmt, expected",
    [
        ("Work... so 3 + 4 = 7.\n#### 1,234", "auto", "1,234"),
        ("a #### 1 #### 2", "gsm8k", "2"),
        ("no marker", "gsm8k", None),
        ("so the answer is \\boxed{\\frac{3}{4}} done", "auto", "\\frac{3}{4}"),
        ("\\boxed{1} then \\boxed{2}", "boxed", "2"),
        ("\\boxed{unclosed", "boxed", None),
        ("  Paris ", "plain", "Paris"),
        ("#### 5 and \\boxed{6}", "auto", "6"),
    ],
)
def test_extract_answer(text, fmt, expected):
    assert extract_answer(text, fmt) == expected


@pytest.mark.parametrize(
    "text, value",
    [("1,234", Fraction(1234)), ("$42", Fraction(42)), ("50%", Fraction(50)), ("-3/4", Fraction(-3, 4)),
     ("\\frac{3}{4}", Fraction(3, 4)), ("0.35", Fraction(35, 100)), ("1e3", Fraction(1000)), ("7.", Fraction(7)),
     ("abc", None), ("1/0", None), ("", None), ("12,34", None)],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_answers_match():
    assert answers_match("42.0", "42") and answers_match("$1,200", "1200") and answers_match("0.75", "3/4")
    assert answers_match("The Eiffel Tower!", "eiffel tower")
    assert not answers_match("41", "42") and not answers_match("", "") and not answers_match("tower", "42")


def test_shipped_sample_and_seed_indexing():
    env = E.make("static_qa")
    assert len(env.items) == 30
    assert env.reset(0) == env.reset(30) == env.items[0][0]
    assert env.gold == "36"
    assert E.make("static_qa").reset(5) == env.reset(5)


def test_single_attempt_success_and_failure():
    env = E.make("static_qa")
    env.reset(0)
    r = env.step("She has 12 + 24 = \\boxed{36} pencils")
    assert (r.reward, r.done, r.info["success"]) == (1.0, True, True)
    env.reset(0)
    r = env.step("35")
    assert (r.reward, r.done, r.info["success"]) == (0.0, True, False)


def test_multi_attempt_rewards_halve():
    env = E.make("static_qa", max_attempts=3)
    env.reset(24)  # gold 11.75
    rewards = [env.step(a).reward for a in ("11", "12")]
    last = env.step("$11.75")
    assert rewards + [last.reward] == [0.0, 0.0, 0.25] and last.done and last.info["success"]
    env.reset(24)
    assert env.step("11").reward == 0.0
    r = env.step("11.750")
    assert (r.reward, r.done) == (0.5, True)
    env.reset(24)
    out = [env.step("1") for _ in range(3)]
    assert [o.reward for o in out] == [0.0] * 3 and [o.done for o in out] == [False, False, True]


def test_blank_answer_is_invalid_and_uses_no_attempt():
    env = E.make("static_qa", max_attempts=2)
    env.reset(1)
    r = env.step("  ")
    assert (r.reward, r.done, r.info["action_is_valid"], env.attempt) == (0.0, False, False, 0)
    assert env.step("\\boxed{}").info["action_is_valid"] is False


def test_parquet_and_json_with_custom_keys(tmp_path):
    rows = [{"problem": "2+5?", "solution": "We add: \\boxed{7}"}, {"problem": "Capital of Peru?", "solution": "Lima"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(rows))
    for name in ("d.parquet", "d.json"):
        env = E.make("static_qa", data_path=str(tmp_path / name), question_key="problem", answer_key="solution")
        assert env.reset(0) == "2+5?" and env.step("7").reward == 1.0
        env.reset(1)
        assert env.step("lima.").reward == 1.0


def test_data_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_path"):
        E.make("static_qa", data_path=str(tmp_path / "missing.jsonl"))
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "x", "a": "1"}) + "\n")
    with pytest.raises(ValueError, match="question_key"):
        E.make("static_qa", data_path=str(path))
    with pytest.raises(ValueError, match="gsm8k"):
        E.make("static_qa", data_path=str(path), question_key="q", answer_key="a", answer_format="gsm8k")
    with pytest.raises(ValueError, match="max_attempts"):
        E.make("static_qa", max_attempts=0)


@settings(max_examples=80, deadline=None)
@given(st.one_of(st.text(max_size=100), st.sampled_from(["\\boxed{", "####", "\\boxed{\\frac{1}{0}}", "1/0"])))
def test_garbage_answers_never_raise(action):
    env = E.make("static_qa", max_attempts=2)
    env.reset(3)
    for _ in range(3):
        r = env.step(action)
        assert all(k in r.info for k in REQUIRED_INFO_KEYS) and r.reward in (0.0, 0.5, 1.0)


def test_config_file_keys_are_env_keys():
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "env" / "static_qa.yaml").read_text())
    assert cfg["name"] == "static_qa" and cfg["max_actions_per_turn"] == 1
    assert set(cfg["config"]) <= set(E.config_keys("static_qa"))
