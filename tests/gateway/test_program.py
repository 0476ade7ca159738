"""Agent programs run against the gateway (hf engine, tiny model): sync and async programs, each with its own
episode; a program that raises, hangs or returns no number fails its episode only."""

import asyncio
import json
import threading
import urllib.request

import aiohttp
import pytest

from ragen.gateway.program import ProgramTask, run_programs
from ragen.gateway.server import Gateway, GatewayThread
from ragen.models import tiny_model
from ragen.rollout.base import SamplingParams
from ragen.rollout.hf import HFEngine

SAMPLING = SamplingParams(max_new_tokens=5, seed=0)
RELEASE = threading.Event()  # set at the end of the module: the hung sync program's thread then ends


@pytest.fixture(scope="module")
def engine(default_tokenizer):
    yield HFEngine(tiny_model(tokenizer=default_tokenizer, seed=0), default_tokenizer, batch_size=8)
    RELEASE.set()


def chat_urllib(base_url, messages):
    req = urllib.request.Request(base_url + "/chat/completions", method="POST", headers={
        "Content-Type": "application/json"}, data=json.dumps({"model": "ragen", "messages": messages}).encode())
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())["choices"][0]["message"]


def sync_program(base_url, api_key, task, seed):
    """Two calls; the reward is the task's number (so a wrong episode would show in the rewards)."""
    messages = [{"role": "user", "content": f"task {task}"}]
    messages.append(chat_urllib(base_url, messages))
    messages.append({"role": "user", "content": "again"})
    chat_urllib(base_url, messages)
    if task == "raise":
        raise ValueError("the program broke")
    if task == "hang":
        RELEASE.wait()
    if task == "text":
        return "high"
    return float(task) + seed / 100


async def async_program(base_url, api_key, task, seed):
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {api_key}"}) as s:
        async with s.post(base_url + "/chat/completions", json={
                "model": "ragen", "messages": [{"role": "user", "content": f"task {task}"}]}) as r:
            assert r.status == 200
    if task == "hang":
        await asyncio.sleep(3600)
    if task == "raise":
        raise KeyError("missing")
    return float(task) + seed / 100


TASKS = ["1", "raise", "2", "hang", "3", "text"]


@pytest.mark.parametrize("program", [sync_program, async_program])
def test_programs_run_concurrently_and_failures_stay_local(engine, default_tokenizer, program):
    tasks = [ProgramTask(f"ep{i}", t, seed=i) for i, t in enumerate(TASKS)]
    gw = Gateway(engine, default_tokenizer, SAMPLING)
    with GatewayThread(gw) as thread:
        results = thread.submit(run_programs(gw, program, tasks, time_limit_s=10))
        late = thread.submit(_late_call(gw))
    assert [r.episode for r in results] == [t.episode for t in tasks]
    assert [r.reward for r in results] == [1.0, 0.0, 2.02, 0.0, 3.04, 0.0]
    assert [r.failed for r in results] == [False, True, False, True, False, True]
    assert "the program broke" in results[1].error or "missing" in results[1].error
    assert results[3].error == "timed out after 10 s"
    calls = 2 if program is sync_program else 1
    for r in results:
        log = gw.book.episode(r.episode)
        assert log.failed == r.failed and log.closed and len(log.calls) == calls
        assert (r.error in log.errors) == r.failed
        assert log.rows().forks == [] and len(log.rows().rows) == 1
    assert late == (400, "episode_closed") and not gw.book.episode("ep0").failed
    assert ("must return a finite number" if program is sync_program else "could not convert") in results[5].error


async def _late_call(gw):
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url("ep0") + "/chat/completions", json={
                "model": "ragen", "messages": [{"role": "user", "content": "late"}]}) as r:
            return r.status, (await r.json())["error"]["code"]


def test_episode_keys_must_be_unique(engine, default_tokenizer):
    gw = Gateway(engine, default_tokenizer, SAMPLING)
    with pytest.raises(ValueError, match="own episode key"):
        asyncio.run(run_programs(gw, sync_program, [ProgramTask("a", "1", 0), ProgramTask("a", "2", 1)], 1))


def test_async_callable_objects_count_as_async():
    from ragen.gateway.program import _is_async

    class Agent:
        async def __call__(self, base_url, api_key, task, seed):
            return 1.0

    assert _is_async(async_program) and _is_async(Agent())
    assert not _is_async(sync_program) and not _is_async(print)
