"""The gateway's HTTP server with a real HTTP client (aiohttp's): answers, records, batching, retries, bad requests,
sampling overrides, tool calls, log-probs, and a port that closes with the server."""

import asyncio
import json
import socket
import threading
import urllib.request

import aiohttp
import pytest

from ragen.gateway.server import OVERRIDDEN_HEADER, Gateway, GatewayConfig, GatewayThread
from ragen.rollout.base import SamplingParams

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=16)


def user(text):
    return [{"role": "user", "content": text}]


def scripted(fake_engine, tokenizer, text="hello there"):
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eot]
    return fake_engine.fixed(ids)


async def post(session, url, body, headers=None):
    async with session.post(url + "/chat/completions", json=body, headers=headers or {}) as r:
        return r.status, await r.json(), dict(r.headers)


def run(coro):
    return asyncio.run(coro)


def test_answers_and_records_exact_tokens(fake_engine, default_tokenizer):
    engine = scripted(fake_engine, default_tokenizer)

    async def main():
        async with Gateway(engine, default_tokenizer, SAMPLING) as gw, aiohttp.ClientSession() as s:
            status, body, headers = await post(s, gw.base_url("e1"), {"model": "ragen", "messages": user("hi"),
                                                                      "logprobs": True, "temperature": 0.3})
            async with s.get(gw.base_url("e1") + "/models") as r:
                models = await r.json()
            return gw, status, body, headers, models

    gw, status, body, headers, models = run(main())
    assert status == 200 and models["data"][0]["id"] == "ragen"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "hello there"}
    assert choice["finish_reason"] == "stop"
    (rec,) = gw.book.episode("e1").calls
    prompts, sampling = engine.calls[0]
    assert rec.prompt_ids == tuple(prompts[0]) == tuple(default_tokenizer.apply_chat_template(
        user("hi"), tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert list(rec.sampled_ids) == engine.script(0, 0, []) and rec.finish_reason == "stop"
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == pytest.approx(list(rec.log_probs))
    assert list(rec.log_probs) == pytest.approx([-0.01 - 0.001 * j for j in range(len(rec.sampled_ids))])
    # the run's sampling, not the request's: said in the header and the body
    assert sampling.temperature == 1.0 and headers[OVERRIDDEN_HEADER] == "temperature"
    assert body["ragen"]["overridden"] == ["temperature"] and body["ragen"]["sampling"]["temperature"] == 1.0
    assert body["usage"]["completion_tokens"] == len(rec.sampled_ids)


def test_retries_are_answered_once(fake_engine, default_tokenizer):
    engine = scripted(fake_engine, default_tokenizer)

    async def main():
        async with Gateway(engine, default_tokenizer, SAMPLING) as gw, aiohttp.ClientSession() as s:
            req = {"model": "ragen", "messages": user("hi")}
            first = await asyncio.gather(*[post(s, gw.base_url("e"), req, {"Idempotency-Key": "k1"})
                                           for _ in range(3)])
            again = await post(s, gw.base_url("e"), req, {"Idempotency-Key": "k1"})
            other = await post(s, gw.base_url("e"), req, {"X-Request-Id": "k2"})
            return gw, first + [again], other

    gw, same, other = run(main())
    assert all(b == same[0][1] for _, b, _ in same) and same[0][1]["ragen"]["request_id"] == "k1"
    assert [c.request_id for c in gw.book.episode("e").calls] == ["k1", "k2"]
    assert sum(len(p) for p, _ in engine.calls) == 2


def test_n_samples_share_a_group_and_budgets_cap(fake_engine, default_tokenizer):
    engine = fake_engine(lambda call, i, prompt: list(range(100 + i, 140 + i)))

    async def main():
        async with Gateway(engine, default_tokenizer, SAMPLING) as gw, aiohttp.ClientSession() as s:
            a = await post(s, gw.base_url("e"), {"model": "ragen", "messages": user("x"), "n": 3, "max_tokens": 5})
            b = await post(s, gw.base_url("e"), {"model": "ragen", "messages": user("y"), "max_tokens": 999})
            return gw, a, b

    gw, (_, a, _), (_, b, _) = run(main())
    calls = gw.book.episode("e").calls
    assert len(a["choices"]) == 3 and [c.sample_index for c in calls[:3]] == [0, 1, 2]
    assert {c.group_id for c in calls[:3]} == {a["ragen"]["group_id"]}
    assert [c.sampled_ids for c in calls[:3]] == [tuple(range(100 + i, 105 + i)) for i in range(3)]
    assert [c["finish_reason"] for c in a["choices"]] == ["length"] * 3
    assert len(calls[3].sampled_ids) == SAMPLING.max_new_tokens  # the run's budget caps the request's


def test_concurrent_calls_share_engine_batches(fake_engine, default_tokenizer):
    """While the engine samples one call, the calls that arrive wait and go to the engine together."""
    release = threading.Event()
    inner = scripted(fake_engine, default_tokenizer)

    class Gated:
        calls = inner.calls

        def generate(self, prompts, sampling):
            if not inner.calls:
                release.wait()
            return inner.generate(prompts, sampling)

    async def main():
        async with Gateway(Gated(), default_tokenizer, SAMPLING, GatewayConfig(gather_s=0)) as gw, \
                aiohttp.ClientSession() as s:
            first = asyncio.create_task(post(s, gw.base_url("e0"), {"model": "ragen", "messages": user("0")}))
            while gw.batcher.engine_calls < 1:
                await asyncio.sleep(0.001)
            rest = [asyncio.create_task(post(s, gw.base_url(f"e{i}"), {"model": "ragen", "messages": user(str(i))}))
                    for i in range(1, 16)]
            while gw.batcher.pending < 15:
                await asyncio.sleep(0.001)
            release.set()
            return gw, await asyncio.gather(first, *rest)

    gw, answers = run(main())
    assert [len(p) for p, _ in inner.calls] == [1, 15]
    assert all(status == 200 for status, _, _ in answers)


@pytest.mark.parametrize("body, code", [
    (b"{not json", "invalid_request_error"),
    (json.dumps({"model": "gpt-4", "messages": user("hi")}).encode(), "model_not_found"),
    (json.dumps({"model": "ragen", "messages": user("word " * 400)}).encode(), "context_length_exceeded"),
    (json.dumps({"model": "ragen", "messages": "hi"}).encode(), "invalid_request_error"),
    (json.dumps({"model": "ragen", "messages": user("hi"), "stream": True}).encode(), "invalid_request_error"),
    (json.dumps({"model": "ragen", "messages": user("hi"), "n": 0}).encode(), "invalid_request_error"),
])
def test_bad_requests_are_400_and_fail_the_episode(fake_engine, default_tokenizer, body, code):
    engine = scripted(fake_engine, default_tokenizer)

    async def main():
        config = GatewayConfig(max_model_len=200)
        async with Gateway(engine, default_tokenizer, SAMPLING, config) as gw, aiohttp.ClientSession() as s:
            async with s.post(gw.base_url("bad") + "/chat/completions", data=body,
                              headers={"Content-Type": "application/json"}) as r:
                bad = r.status, await r.json()
            good = await post(s, gw.base_url("good"), {"model": "ragen", "messages": user("hi")})
            return gw, bad, good

    gw, (status, err), (good_status, _, _) = run(main())
    assert status == 400 and err["error"]["code"] == code and err["error"]["message"]
    assert gw.book.episode("bad").failed and gw.book.episode("bad").calls == []
    assert good_status == 200 and not gw.book.episode("good").failed
    assert gw.book.counters()["gateway/failed_episodes"] == 1.0


def test_tool_calls_and_malformed_ones(fake_engine, default_tokenizer):
    eot = default_tokenizer.convert_tokens_to_ids("<|im_end|>")
    texts = ['Sure.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}}\n</tool_call>',
             '<tool_call>\n{"name": "calc", "arguments": {"expr": \n</tool_call>']
    engine = fake_engine(lambda call, i, p: default_tokenizer(texts[call], add_special_tokens=False)["input_ids"]
                         + [eot])
    sampling = SamplingParams(max_new_tokens=64)

    async def main():
        config = GatewayConfig(tool_format="hermes")
        async with Gateway(engine, default_tokenizer, sampling, config) as gw, aiohttp.ClientSession() as s:
            req = {"model": "ragen", "messages": user("1+2?"), "tools": [{"type": "function", "function": {
                "name": "calc", "parameters": {"type": "object"}}}]}
            return [(await post(s, gw.base_url("t"), req))[1] for _ in range(2)]

    good, bad = run(main())
    msg = good["choices"][0]["message"]
    assert good["choices"][0]["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
        ("calc", {"expr": "1+2"})]
    assert msg["content"] == texts[0]  # the default template does not render tool_calls: the text stays
    assert good["ragen"]["malformed_tool_calls"] == [False] and bad["ragen"]["malformed_tool_calls"] == [True]
    assert bad["choices"][0]["message"] == {"role": "assistant", "content": texts[1]}
    assert bad["choices"][0]["finish_reason"] == "stop"


def _port_open(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_sync_wrapper_and_no_port_left_open(fake_engine, default_tokenizer):
    engine = scripted(fake_engine, default_tokenizer)
    gw = Gateway(engine, default_tokenizer, SAMPLING)
    with GatewayThread(gw) as thread:
        req = urllib.request.Request(gw.base_url() + "/chat/completions", method="POST",
                                     data=json.dumps({"model": "ragen", "messages": user("hi")}).encode(),
                                     headers={"Content-Type": "application/json", "X-Ragen-Episode": "h"})
        with urllib.request.urlopen(req) as r:
            body = json.loads(r.read())
        assert _port_open(gw.port)
        assert thread.call(lambda: len(gw.book.episode("h").calls)) == 1
    assert body["ragen"]["episode"] == "h"
    assert not _port_open(gw.port)

    async def again():
        async with Gateway(engine, default_tokenizer, SAMPLING) as g:
            port = g.port
            assert _port_open(port)
        return port

    assert not _port_open(run(again()))


def test_an_engine_error_fails_the_call_and_its_episode_only(fake_engine, default_tokenizer):
    def script(call, i, prompt):
        if call == 0:
            raise RuntimeError("out of memory")
        return [5, 6]

    async def main():
        async with Gateway(fake_engine(script), default_tokenizer, SAMPLING) as gw, aiohttp.ClientSession() as s:
            a = await post(s, gw.base_url("a"), {"model": "ragen", "messages": user("hi")})
            b = await post(s, gw.base_url("b"), {"model": "ragen", "messages": user("hi")})
            return gw, a, b

    gw, (status_a, err, _), (status_b, _, _) = run(main())
    assert status_a == 500 and "out of memory" in err["error"]["message"] and status_b == 200
    assert gw.book.episode("a").failed and gw.book.episode("a").calls == []
    assert not gw.book.episode("b").failed and len(gw.book.episode("b").calls) == 1
