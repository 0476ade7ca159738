"""Env faults at scale: envs that raise, hang or return malformed results, mixed into real rollouts of
the bandit env through the agent proxy -> the rollout goes on, faulty episodes are counted, masked and logged with
their seed; never a hang."""

from __future__ import annotations

import logging
import math
import time

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.agent.env_manager import EnvTimeout, call_with_timeout
from ragen.env import make, register
from ragen.env.base import StepResult

MODES = ("ok", "raise", "hang", "nan_reward", "tuple", "obs_none", "hang_reset", "inf_reward")
HANG_S = 30.0


@register("faulty_bandit")
class FaultyBandit:
    """The real bandit env, with the fault ``MODES[seed % len(MODES)]`` injected into its episode."""

    def __init__(self) -> None:
        self.inner = make("bandit")
        self.mode = "ok"

    @property
    def instructions(self) -> str:
        return self.inner.instructions

    def legal_actions(self) -> str:
        return self.inner.legal_actions()

    def reset(self, seed: int) -> str:
        self.mode = MODES[seed % len(MODES)]
        if self.mode == "hang_reset":
            time.sleep(HANG_S)
        return self.inner.reset(seed)

    def step(self, action: str):
        res = self.inner.step(action)
        if self.mode == "raise":
            raise RuntimeError("simulated env crash")
        if self.mode == "hang":
            time.sleep(HANG_S)
        if self.mode == "nan_reward":
            return StepResult(res.observation, float("nan"), res.done, res.info)
        if self.mode == "inf_reward":
            return StepResult(res.observation, float("inf"), res.done, res.info)
        if self.mode == "tuple":
            return (res.observation, res.reward, res.done, res.info)
        if self.mode == "obs_none":
            return StepResult(None, res.reward, res.done, res.info)
        return res


def _answer(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|end|>")]
    return lambda call, i, prompt: ids


def test_call_with_timeout():
    assert call_with_timeout(lambda x: x + 1, 1.0, "f", 1) == 2
    assert call_with_timeout(lambda: 3, None, "f") == 3
    with pytest.raises(KeyError):
        call_with_timeout(lambda: {}["x"], 1.0, "f")
    t0 = time.perf_counter()
    with pytest.raises(EnvTimeout, match=r"slow.step did not return within agent.env_step_timeout=0.05 s"):
        call_with_timeout(time.sleep, 0.05, "slow.step", 5.0)
    assert time.perf_counter() - t0 < 1.0


def test_faulty_envs_in_a_real_rollout_are_counted_masked_and_logged(char_tok, fake_engine, caplog):
    """16 groups x 2 envs; seeds 0..15 cycle through the 8 modes, so each fault hits 2 groups (4 episodes)."""
    engine = fake_engine(_answer(char_tok, "<answer>dragon</answer>"))
    cfg = AgentConfig(max_turn=1, think=False, env_step_timeout=0.3)
    proxy = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("faulty_bandit", {}, n_groups=16, group_size=2)], [],
                       seed=0)
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="ragen.agent.rollout"):
        batch = proxy.rollout("train")
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0  # 8 hung episodes (reset or step) cost one 0.3 s timeout each, never 30 s
    seeds = [ep.seed for ep in batch.episodes]
    assert seeds == [g for g in range(16) for _ in range(2)]
    faulty = [MODES[s % len(MODES)] != "ok" for s in seeds]
    failed = [ep.failed for ep in batch.episodes]
    assert failed == faulty and sum(failed) == 28
    assert batch.metrics["rollout/env_errors"] == 28.0
    assert batch.metrics["env/faulty_bandit/failed"] == 28.0
    errors = {MODES[ep.seed % len(MODES)]: ep.error for ep in batch.episodes if ep.failed}
    assert "simulated env crash" in errors["raise"]
    assert "EnvTimeout" in errors["hang"] and "faulty_bandit.step" in errors["hang"]
    assert "faulty_bandit.reset" in errors["hang_reset"]
    assert "reward nan is not a finite number" in errors["nan_reward"] and "inf" in errors["inf_reward"]
    assert "tuple, not StepResult" in errors["tuple"] and "observation is NoneType" in errors["obs_none"]
    # masked: failed rows train nothing; the clean rows earn the bandit's real reward on their last model token
    rows = torch.tensor(failed)
    assert batch.response_mask[rows].sum() == 0 and batch.token_rewards[rows].abs().sum() == 0
    assert batch.response_mask[~rows].sum(-1).min() > 0
    assert all(math.isfinite(v) for v in batch.token_rewards.flatten().tolist())
    assert batch.token_rewards[~rows].sum(-1).tolist() == [ep.turns[0].reward for ep in batch.episodes
                                                            if not ep.failed]
    # logged with their seed: the first 5 in full, then a count
    lines = [r.getMessage() for r in caplog.records]
    assert "env faulty_bandit seed 1 (group 1) failed" in lines[0] and len(lines) == 6
    assert lines[-1].endswith("23 more failed episodes")
    # the next rollout rebuilds the failed envs and goes on (fresh seeds 16..31)
    again = proxy.rollout("train")
    assert [ep.seed for ep in again.episodes][::2] == list(range(16, 32))
    assert again.metrics["rollout/env_errors"] == 28.0
