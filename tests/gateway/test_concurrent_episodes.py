"""Sixteen programs at once against the hf engine with a tiny model: each episode's records hold only its own calls,
every recorded token is a token the engine sampled (with its log-prob), and under the default template (which
does not re-render history) every call after the first merges into one row."""

import asyncio

import aiohttp
import pytest

from ragen.gateway.server import Gateway
from ragen.models import tiny_model
from ragen.rollout.base import SamplingParams
from ragen.rollout.hf import HFEngine

EPISODES, CALLS = 16, 3


class Recording:
    """Delegates to an engine and keeps every (prompt, sample) pair it produced."""

    def __init__(self, engine):
        self.engine, self.pairs = engine, []

    def generate(self, prompts, sampling):
        samples = self.engine.generate(prompts, sampling)
        self.pairs += [(tuple(p), s) for p, s in zip(prompts, samples, strict=True)]
        return samples


async def program(session, base_url, episode):
    """A plain chat loop: three questions, each answer appended to the history as received."""
    messages = [{"role": "system", "content": f"You serve episode {episode}."}]
    for k in range(CALLS):
        messages.append({"role": "user", "content": f"episode {episode} question {k}"})
        async with session.post(base_url + "/chat/completions", json={
                "model": "ragen", "messages": messages, "max_tokens": 6 + episode % 5}) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        messages.append(body["choices"][0]["message"])
    return messages


@pytest.fixture(scope="module")
def engine(default_tokenizer):
    return Recording(HFEngine(tiny_model(tokenizer=default_tokenizer, seed=0), default_tokenizer, batch_size=16))


def test_sixteen_programs_no_cross_talk_exact_tokens(engine, default_tokenizer):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)

    async def main():
        async with Gateway(engine, default_tokenizer, sampling) as gw, aiohttp.ClientSession() as s:
            await asyncio.gather(*[program(s, gw.base_url(f"ep{e}"), e) for e in range(EPISODES)])
            return gw

    gw = asyncio.run(main())
    assert sorted(gw.book.episodes) == sorted(f"ep{e}" for e in range(EPISODES))
    for e in range(EPISODES):
        log = gw.book.episode(f"ep{e}")
        assert len(log.calls) == CALLS and not log.failed
        for rec in log.calls:
            text = default_tokenizer.decode(list(rec.prompt_ids))
            assert f"You serve episode {e}." in text
            assert all(f"episode {o} " not in text for o in range(EPISODES) if o != e)
            matches = [s for p, s in engine.pairs if p == rec.prompt_ids and tuple(s.token_ids[:len(
                rec.sampled_ids)]) == rec.sampled_ids]
            assert matches, "a recorded sample the engine did not produce"
            assert list(rec.log_probs) == list(matches[0].log_probs[:len(rec.log_probs)])
            assert len(rec.sampled_ids) <= 6 + e % 5
        rows = log.rows()
        assert rows.forks == [] and rows.merged == CALLS - 1
        (row,) = rows.rows
        assert sum(row.model_mask) == sum(len(c.sampled_ids) for c in log.calls)
    assert gw.book.counters() == {"gateway/merged_turns": float(EPISODES * (CALLS - 1)), "gateway/forks": 0.0,
                                  "gateway/failed_episodes": 0.0}
