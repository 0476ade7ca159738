"""Env faults inside a trainer run: a tiny PPO run whose env raises, hangs past ``agent.env_step_timeout``
or returns a malformed observation on some seeds completes; the faulty episodes are counted (``rollout/env_errors``
in metrics.jsonl), masked, and logged with their seed in ``env_errors.jsonl``. The faults are in ``reset``: the tiny
random model's responses are malformed, so its episodes never call ``step`` (step faults, NaN rewards included:
``tests/agent/test_env_faults.py``)."""

from __future__ import annotations

import json
import math
import time

from trainer_helpers import read_metrics, tiny_overrides

from ragen.env import register
from ragen.env.bandit import BanditEnv

MODES = ("ok", "raise", "ok", "hang", "ok", "none_obs")  # by seed % 6: every step mixes good and faulty seeds
SEEN: list[int] = []


@register("faulty_run_bandit")
class FaultyRunBandit(BanditEnv):
    """The bandit env (same config keys) with the fault ``MODES[seed % 6]`` in its reset."""

    def reset(self, seed: int) -> str:
        SEEN.append(seed)
        mode = MODES[seed % len(MODES)]
        obs = super().reset(seed)
        if mode == "raise":
            raise RuntimeError("simulated env crash")
        if mode == "hang":
            time.sleep(5.0)
        return None if mode == "none_obs" else obs


def test_a_run_with_faulty_envs_completes_counting_and_logging_them(tmp_path):
    from ragen.launch import run
    from ragen.trainer.config.compose import load_train_config

    SEEN.clear()
    cfg = load_train_config("ppo_bandit", [
        *tiny_overrides(tmp_path, 2), "trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0",
        "trainer.report=false", "algorithm.estimator=grpo", "critic.enable=false", "env.name=faulty_run_bandit",
        "rollout.n_groups=3", "actor.mini_batch_size=6", "rollout.val_n_groups=1", "agent.env_step_timeout=0.5",
        "algorithm.rollout_filter_ratio=1.0"])
    t0 = time.perf_counter()
    run(cfg)
    assert time.perf_counter() - t0 < 120  # the hung env calls were cut at 0.5 s, not waited for
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollout/env_errors"] > 0 for r in records)
    assert all(math.isfinite(v) for r in records for v in r.values())
    rows = [json.loads(line) for line in (tmp_path / "env_errors.jsonl").read_text().splitlines()]
    assert len(rows) == sum(r["rollout/env_errors"] for r in records)
    assert {r["step"] for r in rows} == {1, 2}
    for row in rows:  # each names its seed, and that seed's fault
        mode = MODES[row["seed"] % len(MODES)]
        assert mode != "ok" and row["env"] == "faulty_run_bandit", row
        expected = {"raise": "simulated env crash", "hang": "env_step_timeout", "none_obs": "reset returned None"}
        assert expected[mode] in row["error"], row
    assert {MODES[r["seed"] % len(MODES)] for r in rows} == {"raise", "hang", "none_obs"}


@register("broken_run_bandit")
class BrokenRunBandit(BanditEnv):
    """The bandit env whose every reset raises: every episode of every step fails."""

    def reset(self, seed: int) -> str:
        raise KeyError("the secret table is missing")


@register("no_legal_actions_bandit")
class NoLegalActionsBandit(BanditEnv):
    """The bandit env with an expert but without ``legal_actions`` (a method a first env forgets)."""

    def __getattribute__(self, name):
        if name == "legal_actions":
            raise AttributeError(f"'{type(self).__name__}' object has no attribute 'legal_actions'")
        return super().__getattribute__(name)


def _broken_run(tmp_path, env: str, *extra: str):
    from ragen.launch import run
    from ragen.trainer.config.compose import load_train_config

    return run(load_train_config("ppo_bandit", [
        *tiny_overrides(tmp_path, 5), "trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0",
        "trainer.report=false", f"env.name={env}", *extra]))


def test_a_run_whose_every_episode_fails_stops_naming_the_env_and_the_reason(tmp_path):
    import pytest

    from ragen.trainer.numerics import AllEpisodesFailed

    with pytest.raises(AllEpisodesFailed) as info:
        _broken_run(tmp_path, "broken_run_bandit")  # trainer.max_failed_steps=2 (the default)
    message = str(info.value)
    assert "every episode of the last 2 training step(s) failed" in message
    assert "env broken_run_bandit" in message and "the secret table is missing" in message
    assert "trainer.max_failed_steps" in message
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]  # step 2 stopped the run before it was logged
    rows = (tmp_path / "env_errors.jsonl").read_text().splitlines()
    assert {json.loads(r)["step"] for r in rows} == {1, 2}


def test_a_warm_start_on_an_env_without_legal_actions_names_the_method_not_the_expert(tmp_path):
    import pytest

    from ragen.trainer.numerics import AllEpisodesFailed

    with pytest.raises(AllEpisodesFailed) as info:
        _broken_run(tmp_path, "no_legal_actions_bandit", "trainer.sft_warmup_steps=2", "sft.noise=0",
                    "agent.response_prefix='<answer>'", "agent.think=false")
    message = str(info.value)
    assert "warm-start step" in message and "legal_actions" in message and "expert" not in message
