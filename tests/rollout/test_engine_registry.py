"""make_engine: each name builds its class with the given arguments, unknown names list the valid ones, backends
load lazily, and the built engines generate through the protocol (tiny model / fake transport)."""

import sys

import pytest
import torch

from ragen.models import tiny_model
from ragen.rollout import Engine, Sample, SamplingParams, engine_names, make_engine
from ragen.rollout.registry import engine_class

PROMPTS = [[1, 2000, 300, 45, 9], [7], [1, 11, 12, 13]]


def test_engine_names():
    assert engine_names() == ["hf", "openai", "vllm"]


@pytest.mark.parametrize(("name", "module", "cls"), [
    ("hf", "ragen.rollout.hf", "HFEngine"),
    ("openai", "ragen.rollout.openai_engine", "OpenAIEngine"),
    ("vllm", "ragen.rollout.vllm_engine", "VLLMEngine"),
])
def test_engine_class_by_name(name, module, cls):
    found = engine_class(name)
    assert (found.__module__, found.__name__) == (module, cls)


@pytest.mark.parametrize("bad", ["sglang", "HF", "", "hf "])
def test_unknown_engine_lists_valid_names(bad):
    with pytest.raises(ValueError, match=rf"unknown engine '{bad}'; valid engines: hf, openai, vllm$"):
        make_engine(bad)


@pytest.fixture(scope="module")
def tiny(default_tokenizer):
    return tiny_model(tokenizer=default_tokenizer, seed=0)


def test_make_hf_engine_builds_hf_engine_with_the_arguments(tiny, default_tokenizer):
    from ragen.rollout.hf import HFEngine

    engine = make_engine("hf", model=tiny, tokenizer=default_tokenizer, batch_size=2)
    assert type(engine) is HFEngine and isinstance(engine, Engine)
    assert engine.model is tiny and engine.tokenizer is default_tokenizer  # shared, not copied
    assert engine.batch_size == 2 and engine.device == torch.device("cpu") and engine.dtype == torch.float32
    assert engine.eos_ids == {default_tokenizer.eos_token_id} and engine.pad_id == default_tokenizer.pad_token_id
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        make_engine("hf", model=tiny, tokenizer=default_tokenizer, batch_size=0)


def test_built_hf_engine_generates_per_prompt_samples(tiny, default_tokenizer):
    from ragen.rollout.hf import HFEngine

    engine = make_engine("hf", model=tiny, tokenizer=default_tokenizer, batch_size=2)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=0)
    samples = engine.generate(PROMPTS, sampling)
    assert len(samples) == len(PROMPTS) and all(isinstance(s, Sample) for s in samples)
    vocab = tiny.get_input_embeddings().weight.shape[0]
    for s in samples:
        assert len(s.token_ids) == len(s.log_probs) and 1 <= len(s.token_ids) <= 6
        assert all(isinstance(t, int) and 0 <= t < vocab for t in s.token_ids)
        assert all(-50.0 < lp <= 0.0 for lp in s.log_probs)
        stopped = s.token_ids[-1] in engine.eos_ids
        assert s.finish_reason == ("stop" if stopped else "length")
        assert stopped or len(s.token_ids) == 6
    # the same seed gives the same samples; greedy decoding equals an HFEngine built directly, in prompt order
    again = engine.generate(PROMPTS, sampling)
    assert [s.token_ids for s in again] == [s.token_ids for s in samples]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    direct = HFEngine(tiny, default_tokenizer, batch_size=3).generate(PROMPTS, greedy)
    built = engine.generate(PROMPTS, greedy)
    assert [s.token_ids for s in built] == [s.token_ids for s in direct]
    for b, d in zip(built, direct, strict=True):
        assert b.log_probs == pytest.approx(d.log_probs, abs=1e-5)
    single = [engine.generate([p], greedy)[0].token_ids for p in PROMPTS]
    assert single == [s.token_ids for s in built]
    # a stop token id ends that prompt's sample right after its first occurrence, with reason "stop"
    first = built[0].token_ids
    stop = SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=(first[1],))
    cut = engine.generate(PROMPTS, stop)[0]
    assert cut.token_ids == first[: first.index(first[1]) + 1] and cut.finish_reason == "stop"


def test_make_openai_engine_generates_through_its_transport():
    from ragen.rollout.openai_engine import OpenAIEngine

    seen = []

    def transport(url, payload, headers, timeout):
        seen.append((url, payload, timeout))
        choices = [{"index": i, "text": "", "finish_reason": "length",
                    "logprobs": {"tokens": [f"token_id:{p[-1] + 1}"], "token_logprobs": [-0.5]}}
                   for i, p in enumerate(payload["prompt"])]
        return {"choices": choices}

    engine = make_engine("openai", model="m", base_url="http://x:9/v1", transport=transport, timeout=7.0)
    assert type(engine) is OpenAIEngine and isinstance(engine, Engine)
    samples = engine.generate([[1, 2], [5]], SamplingParams(max_new_tokens=1))
    assert [(s.token_ids, s.log_probs, s.finish_reason) for s in samples] == [([3], [-0.5], "length"),
                                                                               ([6], [-0.5], "length")]
    (url, payload, timeout), = seen
    assert (url, payload["model"], payload["prompt"], timeout) == ("http://x:9/v1/completions", "m", [[1, 2], [5]],
                                                                   7.0)


def test_vllm_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"ragen\[gpu\]"):
        make_engine("vllm")


def test_lazy_hf_export():
    import ragen.rollout

    assert ragen.rollout.HFEngine is engine_class("hf")
    with pytest.raises(AttributeError):
        ragen.rollout.NoSuchEngine  # noqa: B018
