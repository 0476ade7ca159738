"""The driver's handle on engines hosted by the actor's ranks (``ragen.trainer.hosted.HostedEngines``), driven by the
real agent proxy: every turn's prompts split into contiguous, balanced shares, one per rank, every episode's turn
played exactly once, samples back in order, so the batch is the one a single engine gives; share k's seed rule.
The ranks are fakes that record what their engine plays."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.trainer.hosted import HostedEngines, share_bounds, share_seed
from ragen.workers.engine_host import EngineHost, EngineSpec


class FakeRanks:
    """A worker group of ``PolicyWorker``-like ranks, each hosting its own engine (``EngineHost`` over a fake)."""

    def __init__(self, engines: list) -> None:
        self.hosts = [EngineHost(EngineSpec("hf"), torch.device("cpu"), make=lambda name, e=e, **kw: e)
                      for e in engines]
        self.world_size = len(engines)

    def call_each(self, method: str, args: list) -> list:
        assert method == "engine_generate"
        return [None if a is None else host.generate(*a) for host, a in zip(self.hosts, args, strict=True)]

    def call(self, method: str, **kw) -> None:
        for host in self.hosts:
            if method == "engine_sleep":
                host.sleep()
            else:
                assert method == "engine_wake"
                host.wake(kw["tags"])


def answer(tok):
    """The same answer for every prompt (the engines are interchangeable; what differs is who plays what)."""
    ids = tok("<answer>right</answer>", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|end|>")]
    return lambda call, i, prompt: ids


# 4 groups of 2 identical episodes, ending after 1, 2, 3 and 3 turns: 8, 6, 4 prompts in turns 0, 1, 2
SPECS = [EnvGroupSpec("test_line", {"horizon": h}, n_groups=1, group_size=2) for h in (1, 2, 3, 3)]


def _rollout(engine, tok):
    return AgentProxy(engine, tok, AgentConfig(max_turn=3, think=False), SPECS, [], seed=3).rollout("train")


def test_two_ranks_play_every_episode_once_in_balanced_contiguous_shares(char_tok, fake_engine):
    single = fake_engine(answer(char_tok))
    ranks = [fake_engine(answer(char_tok)), fake_engine(answer(char_tok))]
    hosted = HostedEngines(FakeRanks(ranks))
    hosted.wake(None)
    want, got = _rollout(single, char_tok), _rollout(hosted, char_tok)
    assert [len(p) for p, _ in single.calls] == [8, 6, 4]
    for turn, (prompts, sampling) in enumerate(single.calls):
        (p0, s0), (p1, s1) = ranks[0].calls[turn], ranks[1].calls[turn]
        assert [len(p0), len(p1)] == [len(prompts) // 2] * 2  # balanced
        assert p0 + p1 == prompts  # contiguous, in order: every episode's turn played once
        assert s0 == sampling and s1 == dataclasses.replace(sampling, seed=share_seed(sampling.seed, 1))
    assert len(ranks[0].calls) == len(ranks[1].calls) == 3
    # group members (identical prompts) were split over the ranks in turn 1: ranks 0 and 1 share a group there
    assert ranks[0].calls[1][0][-1] == ranks[1].calls[1][0][0]
    for field in ("input_ids", "response_mask", "sample_log_probs", "turn_rewards", "num_turns"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert [e.seed for e in got.episodes] == [e.seed for e in want.episodes]


def test_an_empty_share_is_not_played(fake_engine):
    ranks = [fake_engine.fixed([4, 5]) for _ in range(3)]
    hosted = HostedEngines(FakeRanks(ranks))
    hosted.wake(None)
    from ragen.rollout.base import SamplingParams

    out = hosted.generate([[1], [2]], SamplingParams(max_new_tokens=2, seed=None))
    assert [s.token_ids for s in out] == [[4, 5], [4, 5]]
    assert [[p for p in c[0]] for r in ranks for c in r.calls] == [[[1]], [[2]]]
    assert ranks[1].calls[0][1].seed is None  # no seed stays no seed
    hosted.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        hosted.generate([[1]], SamplingParams())


def test_share_bounds_and_seeds():
    assert share_bounds(8, 2) == [(0, 4), (4, 8)]
    assert share_bounds(5, 2) == [(0, 3), (3, 5)]
    assert share_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert share_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert share_bounds(0, 1) == [(0, 0)]
    with pytest.raises(ValueError, match="at least one share"):
        share_bounds(3, 0)
    seeds = [share_seed(1000, k) for k in range(8)]
    assert seeds[0] == 1000 and len(set(seeds)) == 8 and all(0 <= s < 2**63 - 1 for s in seeds)
    # no share of one call samples with the seed of a neighbouring call (the proxy seeds turn t + 1 with seed + 1)
    assert not {share_seed(1000, k) for k in range(1, 8)} & set(range(990, 1010))
    assert share_seed(None, 3) is None and share_seed(7, 1) == share_seed(7, 1)
