"""OpenAI-compatible engine: request/response conversion with a fake transport (no network)."""

import pytest

from ragen.rollout import SamplingParams, openai_engine
from ragen.rollout.openai_engine import OpenAIEngine, completion_request, samples_from_response


def _reply(choices):
    return {"id": "cmpl-1", "object": "text_completion", "choices": choices}


def _choice(index, ids, lps, text, reason):
    tokens = [f"token_id:{i}" for i in ids]
    return {"index": index, "text": text, "finish_reason": reason,
            "logprobs": {"tokens": tokens, "token_logprobs": lps, "top_logprobs": None, "text_offset": []}}


def test_request_body():
    sp = SamplingParams(temperature=0.5, top_p=0.9, top_k=7, max_new_tokens=12, stop=("</answer>",),
                        stop_token_ids=(2,), seed=4)
    body = completion_request("served", [[1, 2], [3]], sp)
    assert body["prompt"] == [[1, 2], [3]] and body["model"] == "served"
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["top_k"]) == (12, 0.5, 0.9, 7)
    assert (body["stop"], body["stop_token_ids"], body["seed"], body["logprobs"]) == (["</answer>"], [2], 4, 1)
    assert body["return_tokens_as_token_ids"] is True
    minimal = completion_request("m", [[1]], SamplingParams())
    assert not {"stop", "stop_token_ids", "top_k", "seed"} & set(minimal)


def test_generate_with_fake_transport_orders_by_index_and_batches():
    calls = []

    def transport(url, payload, headers, timeout):
        calls.append((url, payload, headers))
        n = len(payload["prompt"])
        choices = [_choice(i, [100 + i, 2], [-0.5, -0.1 * (i + 1)], f"t{i}", "stop") for i in range(n)]
        return _reply(list(reversed(choices)))

    engine = OpenAIEngine("served", "http://h:1/v1/", api_key="k", batch_size=2, transport=transport)
    samples = engine.generate([[1], [2], [3]], SamplingParams(max_new_tokens=5))
    assert [c[0] for c in calls] == ["http://h:1/v1/completions"] * 2
    assert [len(c[1]["prompt"]) for c in calls] == [2, 1]
    assert calls[0][2]["Authorization"] == "Bearer k"
    assert [s.token_ids for s in samples] == [[100, 2], [101, 2], [100, 2]]
    assert samples[1].log_probs == [-0.5, -0.2]
    assert samples[0].finish_reason == "stop" and samples[0].extra == {"text": "t0"}


def test_string_tokens_are_mapped_with_tokenizer(default_tokenizer):
    ids = default_tokenizer("Hello world", add_special_tokens=False)["input_ids"]
    tokens = default_tokenizer.convert_ids_to_tokens(ids)
    choice = {"index": 0, "text": "Hello world", "finish_reason": "length",
              "logprobs": {"tokens": tokens, "token_logprobs": [-1.0] * len(ids)}}
    sample = samples_from_response(_reply([choice]), 1, default_tokenizer)[0]
    assert sample.token_ids == ids and sample.finish_reason == "length" and sample.extra["retokenized"]
    with pytest.raises(ValueError, match="pass a tokenizer"):
        samples_from_response(_reply([choice]), 1, None)


def test_wrong_choice_count_raises():
    with pytest.raises(ValueError, match="expected 2 choices"):
        samples_from_response(_reply([_choice(0, [1], [-1.0], "", "stop")]), 2)


def test_retries_then_succeeds(monkeypatch):
    monkeypatch.setattr(openai_engine.time, "sleep", lambda s: None)
    attempts = []

    def flaky(url, payload, headers, timeout):
        attempts.append(1)
        if len(attempts) < 3:
            raise OSError("connection refused")
        return _reply([_choice(0, [5], [-0.25], "x", "length")])

    engine = OpenAIEngine("m", transport=flaky, max_retries=3)
    assert engine.generate([[1]], SamplingParams())[0].log_probs == [-0.25]
    assert len(attempts) == 3
    failing = OpenAIEngine("m", transport=lambda *a: (_ for _ in ()).throw(OSError("down")), max_retries=1)
    with pytest.raises(OSError, match="down"):
        failing.generate([[1]], SamplingParams())


def test_update_weights_unsupported():
    engine = OpenAIEngine("m", transport=lambda *a: {})
    with pytest.raises(RuntimeError, match="engine 'hf' or 'vllm'"):
        engine.update_weights({})
    engine.sleep()
    engine.wake()
