"""GPU-free parts of the vLLM engine, with fake vLLM objects."""

from types import SimpleNamespace

import pytest
import torch

from ragen.rollout import SamplingParams
from ragen.rollout.vllm_engine import sample_from_vllm_output, vllm_sampling_kwargs, weight_items


def test_sampling_kwargs_conversion():
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=33, stop=("</answer>",),
                        stop_token_ids=(5,), seed=11)
    kw = vllm_sampling_kwargs(sp, extra_stop_token_ids=(2,))
    assert kw == {
        "n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 33, "stop": ["</answer>"],
        "stop_token_ids": [2, 5], "include_stop_str_in_output": True, "skip_special_tokens": False,
        "seed": 11, "logprobs": 0,
    }
    plain = vllm_sampling_kwargs(SamplingParams(top_k=20))
    assert (plain["top_k"], plain["stop"], plain["stop_token_ids"], plain["seed"]) == (20, None, None, None)


def _output(token_ids, logprob_values, finish_reason, stop_reason=None):
    logprobs = [
        {tid: SimpleNamespace(logprob=lp, rank=1), tid + 1: SimpleNamespace(logprob=-9.0, rank=2)}
        for tid, lp in zip(token_ids, logprob_values, strict=True)
    ]
    completion = SimpleNamespace(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
                                 stop_reason=stop_reason)
    return SimpleNamespace(outputs=[completion])


def test_result_conversion_picks_sampled_token_log_probs():
    sample = sample_from_vllm_output(_output([10, 20, 2], [-0.5, -1.25, -0.01], "stop", stop_reason=2))
    assert (sample.token_ids, sample.log_probs, sample.finish_reason) == ([10, 20, 2], [-0.5, -1.25, -0.01], "stop")
    assert sample.extra == {"stop_reason": 2}
    length = sample_from_vllm_output(_output([7], [-2.0], "length"))
    assert (length.finish_reason, length.extra) == ("length", {})
    aborted = sample_from_vllm_output(_output([7], [-2.0], "abort"))
    assert aborted.finish_reason == "length"


def test_result_conversion_requires_logprobs():
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1], logprobs=None, finish_reason="stop")])
    with pytest.raises(ValueError, match="logprobs=0"):
        sample_from_vllm_output(out)


def test_weight_items_from_dict_and_pairs():
    w = torch.ones(2)
    assert weight_items({"a": w}) == [("a", w)]
    full = SimpleNamespace(full_tensor=lambda: w)
    assert weight_items(iter([("b", full)])) == [("b", w)]
