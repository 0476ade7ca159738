"""The envs of a batch step concurrently (``agent.env_workers``): they really overlap, the batch is the same for any
pool size (shipped envs, their own RNGs, the real hf engine on the tiny model), env faults are isolated exactly as in
the one-after-another loop, and bad values are refused before start."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec, RolloutBatch
from ragen.agent.env_manager import run_each
from ragen.env import StepResult, make, register
from ragen.models import tiny_model
from ragen.rollout import make_engine

MOVES = ("Left", "Down", "Right", "Up")
SHIPPED = (("frozen_lake", {"is_slippery": True}), ("sokoban", {}), ("countdown", {}), ("bandit", {}))


def _jittered(inner: str):
    """The shipped env ``inner`` with a short sleep before each call whose length varies by seed and call, so calls
    of a concurrent batch end out of slot order (the env's own numbers are untouched)."""

    class Jittered:
        def __init__(self, config: dict | None = None) -> None:
            self.inner, self.seed, self.calls = make(inner, **(config or {})), 0, 0

        def _wait(self) -> None:
            self.calls += 1
            time.sleep(0.002 * ((self.seed * 7 + self.calls) % 4))

        @property
        def instructions(self) -> str:
            return self.inner.instructions

        def legal_actions(self) -> str:
            self._wait()
            return self.inner.legal_actions()

        def reset(self, seed: int) -> str:
            self.seed, self.calls = seed, 0
            self._wait()
            return self.inner.reset(seed)

        def step(self, action: str) -> StepResult:
            self._wait()
            return self.inner.step(action)

    return register(f"jitter_{inner}")(Jittered)


for _name, _ in SHIPPED:
    _jittered(_name)


class ActingEngine:
    """The real engine, sampling a short think text; each response then closes the think block and answers with a
    move chosen by the sampled ids, so envs are stepped with actions that depend on what the model sampled (and so on
    the prompts, which hold the observations). Appended tokens get log-prob 0."""

    def __init__(self, engine, tok, think_tokens: int = 4) -> None:  # noqa: ANN001 - Engine, tokenizer
        self.engine, self.tok, self.think_tokens = engine, tok, think_tokens

    def generate(self, prompts, sampling):  # noqa: ANN001, ANN201 - Engine protocol
        short = dataclasses.replace(sampling, max_new_tokens=self.think_tokens, stop=())
        out = []
        for sample in self.engine.generate(prompts, short):
            ids = [i for i in sample.token_ids if i not in sampling.stop_token_ids]
            move = MOVES[sum(ids) % len(MOVES)]
            tail = self.tok(f"</think><answer>{move}</answer>", add_special_tokens=False)["input_ids"]
            lps = list(sample.log_probs[: len(ids)]) + [0.0] * len(tail)
            out.append(dataclasses.replace(sample, token_ids=ids + tail, log_probs=lps, finish_reason="stop"))
        return out


def _state(batch: RolloutBatch) -> dict:
    """Everything a batch holds except its wall-clock metrics."""
    out = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if f.name == "metrics":
            value = {k: v for k, v in value.items() if not k.startswith("agent/time/")}
        out[f.name] = value
    return out


def _assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key, va in sa.items():
        vb = sb[key]
        if isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and torch.equal(va, vb), key
        else:
            assert va == vb, key


@pytest.fixture(scope="module")
def tiny_engine(default_tokenizer):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_engine("hf", model=tiny_model(tokenizer=default_tokenizer, seed=0), tokenizer=default_tokenizer)
    torch.set_num_threads(threads)


def test_shipped_envs_give_the_same_batch_for_any_pool_size(tiny_engine, default_tokenizer):
    """frozen_lake (slippery: gymnasium's per-env RNG draws in every step), sokoban, countdown and bandit, 3 turns, two
    train rollouts and a val rollout: one worker and four give identical batches (ids, masks, rewards, log-probs,
    episode records, metrics)."""
    specs = [EnvGroupSpec(f"jitter_{name}", {"config": cfg}, n_groups=2, group_size=2, max_turn=3,
                          max_actions_per_turn=1) for name, cfg in SHIPPED]
    batches = {}
    for workers in (1, 4):
        cfg = AgentConfig(max_turn=3, max_new_tokens=24, response_prefix="<think>", env_workers=workers)
        engine = ActingEngine(tiny_engine, default_tokenizer)
        proxy = AgentProxy(engine, default_tokenizer, cfg, specs, specs, seed=5)
        batches[workers] = [proxy.rollout("train"), proxy.rollout("train"), proxy.rollout("val")]
    for one, four in zip(batches[1], batches[4], strict=True):
        _assert_same(one, four)
    first = batches[4][0]
    steps = [t for ep in first.episodes for t in ep.turns]
    assert not first.failed.any() and len(first.episodes) == 16
    assert sum(t.format_ok for t in steps) == len(steps) > 16  # every turn stepped its env, some episodes went on
    assert len({t.actions[0] for t in steps}) > 1  # the sampled ids chose different moves
    assert first.turn_rewards.abs().sum() > 0


@register("test_meeting")
class MeetingEnv:
    """Every reset and step waits at ``BARRIERS[name]`` until ``parties`` calls have arrived (timeout: the barrier
    breaks and the call raises): it completes only when the calls of a batch run at the same time."""

    BARRIERS: dict[str, threading.Barrier] = {}
    instructions = "Meet the others."

    def __init__(self, barrier: str = "") -> None:
        self.barrier = self.BARRIERS[barrier]

    def reset(self, seed: int) -> str:
        self.barrier.wait()
        return "waiting"

    def legal_actions(self) -> str:
        return "wait"

    def step(self, action: str) -> StepResult:
        self.barrier.wait()
        return StepResult("met", 1.0, True, {"action_is_valid": True, "success": True})


def _meeting_rollout(char_tok, fake_engine, workers: int, timeout: float) -> RolloutBatch:
    MeetingEnv.BARRIERS[f"w{workers}"] = threading.Barrier(4, timeout=timeout)
    ids = char_tok("<answer>wait</answer>", add_special_tokens=False)["input_ids"]
    cfg = AgentConfig(max_turn=1, think=False, env_workers=workers, env_step_timeout=None)
    spec = EnvGroupSpec("test_meeting", {"barrier": f"w{workers}"}, n_groups=2, group_size=2)
    return AgentProxy(fake_engine(lambda c, i, p: ids), char_tok, cfg, [spec], []).rollout("train")


def test_the_envs_of_a_batch_run_at_the_same_time(char_tok, fake_engine):
    """Four envs whose resets and steps each wait for all four: with four workers every episode completes; one after
    another, the first call waits alone until its barrier breaks and every episode fails."""
    together = _meeting_rollout(char_tok, fake_engine, workers=4, timeout=60.0)
    assert not together.failed.any() and together.turn_rewards[:, 0].tolist() == [1.0] * 4
    alone = _meeting_rollout(char_tok, fake_engine, workers=1, timeout=0.2)
    assert alone.failed.all() and all("BrokenBarrierError" in ep.error for ep in alone.episodes)


FAULTS = ("ok", "reset", "step", "legal", "hang", "ok2")


@register("test_fault_turns")
class FaultTurns:
    """A 3-turn line walk whose episode of seed s meets the fault ``FAULTS[s % 6]`` on its second turn (``reset``: at
    reset; ``hang``: a step that outlives the timeout)."""

    instructions = "Walk."

    def __init__(self) -> None:
        self.seed, self.steps = 0, 0

    def reset(self, seed: int) -> str:
        self.seed, self.steps = seed, 0
        if FAULTS[seed % 6] == "reset":
            raise RuntimeError(f"reset fault (seed {seed})")
        return "pos=0"

    def legal_actions(self) -> str:
        if FAULTS[self.seed % 6] == "legal" and self.steps == 1:
            raise ValueError(f"legal fault (seed {self.seed})")
        return "left, right"

    def step(self, action: str) -> StepResult:
        self.steps += 1
        fault = FAULTS[self.seed % 6]
        if fault == "step" and self.steps == 2:
            raise RuntimeError(f"step fault (seed {self.seed})")
        if fault == "hang" and self.steps == 2:
            time.sleep(3.0)
        return StepResult(f"pos={self.steps}", float(self.steps), self.steps >= 3, {"action_is_valid": True})


def test_env_faults_are_isolated_exactly_as_one_after_another(char_tok, fake_engine, caplog):
    """Six groups of two, one fault each (none, reset, step, legal actions, a hung step, none): four workers give the
    batch, failed rows, errors and logs of one worker; only the faulty episodes fail."""
    ids = char_tok("<answer>right</answer>", add_special_tokens=False)["input_ids"]
    spec = EnvGroupSpec("test_fault_turns", {}, n_groups=6, group_size=2)
    out, logs = {}, {}
    for workers in (1, 4):
        cfg = AgentConfig(max_turn=3, think=False, env_workers=workers, env_step_timeout=0.5)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ragen.agent.rollout"):
            out[workers] = AgentProxy(fake_engine(lambda c, i, p: ids), char_tok, cfg, [spec], []).rollout("train")
        logs[workers] = [r.getMessage() for r in caplog.records]
    _assert_same(out[1], out[4])
    assert logs[1] == logs[4] and len(logs[4]) == 6
    batch = out[4]
    faults = [FAULTS[ep.seed % 6] for ep in batch.episodes]
    assert faults == [f for f in FAULTS for _ in range(2)]
    assert batch.failed.tolist() == [f not in ("ok", "ok2") for f in faults]
    errors = {f: ep.error for f, ep in zip(faults, batch.episodes, strict=True)}
    assert errors["reset"] == "reset: RuntimeError: reset fault (seed 1)"
    assert errors["step"] == "step: RuntimeError: step fault (seed 2)"
    assert errors["legal"] == "legal_actions: ValueError: legal fault (seed 3)"
    assert errors["hang"] == ("step: ragen.agent.env_manager.EnvTimeout: test_fault_turns.step did not return within "
                              "agent.env_step_timeout=0.5 s")
    assert [len(ep.turns) for ep in batch.episodes] == [3, 3, 0, 0, 2, 2, 1, 1, 2, 2, 3, 3]
    assert batch.metrics["rollout/env_errors"] == 8.0


def test_run_each_keeps_item_order_and_reraises():
    """Results come back in item order whatever order the calls end in; what a call lets escape is raised."""

    def slow_first(x: int) -> int:
        time.sleep(0.01 * (5 - x))
        return x * x

    assert run_each(slow_first, list(range(5)), 5) == [0, 1, 4, 9, 16]
    assert run_each(slow_first, list(range(5)), 1) == [0, 1, 4, 9, 16]
    with pytest.raises(KeyError, match="3"):
        run_each(lambda x: {}[x] if x == 3 else x, list(range(5)), 3)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_bad_env_workers_are_refused_with_key_value_and_fix(bad):
    with pytest.raises(ValueError) as info:
        AgentConfig(env_workers=bad)
    msg = str(info.value)
    assert "AgentConfig.env_workers must be an int >= 1" in msg and f"got {bad!r}" in msg
    assert "1 = one env after another" in msg


def test_bad_env_workers_fail_the_trainer_config_before_start():
    from ragen.launch import validate
    from ragen.trainer.config.compose import compose, to_train_config
    from ragen.trainer.config.schema import ConfigError

    for bad, expected in ((0, "agent.env_workers must be an int >= 1, the threads that step envs at once "
                                "(e.g. 32; 1 = one env after another), got 0"),
                          (-3, "agent.env_workers must be an int >= 1"),
                          ("many", "agent.env_workers='many' has the wrong type: expected int")):
        with pytest.raises(ConfigError) as info:
            validate(to_train_config(compose("base", [f"agent.env_workers={bad}"])))
        assert any(expected in p for p in info.value.problems), info.value.problems
