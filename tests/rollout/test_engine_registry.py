"""make_engine: names, unknown names, lazy backends."""

import sys

import pytest

from ragen.models import tiny_model
from ragen.rollout import Engine, SamplingParams, engine_names, make_engine


def test_engine_names():
    assert engine_names() == ["hf", "openai", "vllm"]


def test_unknown_engine_lists_valid_names():
    with pytest.raises(ValueError, match="unknown engine 'sglang'; valid engines: hf, openai, vllm"):
        make_engine("sglang")


def test_make_hf_engine_follows_protocol(default_tokenizer):
    engine = make_engine("hf", model=tiny_model(tokenizer=default_tokenizer), tokenizer=default_tokenizer)
    assert isinstance(engine, Engine)
    sample = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, seed=0))[0]
    assert len(sample.token_ids) == len(sample.log_probs) == 3


def test_make_openai_engine_follows_protocol():
    engine = make_engine("openai", model="m", transport=lambda *a: {})
    assert isinstance(engine, Engine)


def test_vllm_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"ragen\[gpu\]"):
        make_engine("vllm")


def test_lazy_hf_export():
    import ragen.rollout

    assert ragen.rollout.HFEngine.__name__ == "HFEngine"
    with pytest.raises(AttributeError):
        ragen.rollout.NoSuchEngine  # noqa: B018
