"""``env=agent_program`` end to end: a two-step PPO run of the tiny model trains the shipped calculator program
(``ragen.gateway.examples.calculator``) with one config line. Every model token the trainer trains on is a token the
engine sampled, after exactly the prompt it was sampled for (with its log-prob); the weights change; the gateway's
counters are logged; a program run that raises fails its episode only. A bad entry fails before the start."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from trainer_helpers import load_actor_weights, read_metrics, tiny_init_weights, tiny_overrides

from ragen.gateway.examples import calculator

_COUNT = itertools.count()
_LOCK = threading.Lock()


def flaky_calculator(base_url, api_key, task, seed):
    """The calculator program, whose second run of every rollout (of four) raises after its calls."""
    with _LOCK:
        n = next(_COUNT)
    reward = calculator.run(base_url, api_key, task, seed)
    if n % 4 == 1:
        raise RuntimeError("the program broke")
    return reward


def _overrides(out, *extra, env="agent_program"):
    return [*tiny_overrides(out, 2), f"env={env}", "trainer.use_ray=false", "trainer.val_before_train=false",
            "trainer.val_freq=0", "trainer.report=false", *extra]


def _runs(turn_ids: torch.Tensor) -> list[tuple[int, int]]:
    """The maximal runs of model tokens of a row (``turn_ids >= 0``): [(start, end)]."""
    runs, start = [], None
    for t, k in enumerate(turn_ids.tolist() + [-1]):
        if k >= 0 and start is None:
            start = t
        if k < 0 and start is not None:
            runs.append((start, t))
            start = None
    return runs


@pytest.mark.parametrize("layout", ["trajectory", "turn"])
def test_a_program_trains_on_exactly_the_sampled_tokens(tmp_path, monkeypatch, layout):
    from ragen.gateway.batching import Batcher
    from ragen.launch import run
    from ragen.trainer import credit
    from ragen.trainer.config.compose import load_train_config

    sampled, batches = [], []  # (prompt, sample ids, log-probs) the engine returned; (rollout, train batch)
    generate, to_train_batch = Batcher.generate, credit.to_train_batch

    async def recording_generate(self, prompts, sampling):
        samples = await generate(self, prompts, sampling)
        sampled.extend((tuple(p), tuple(s.token_ids), tuple(s.log_probs)) for p, s in zip(prompts, samples,
                                                                                           strict=True))
        return samples

    def recording_to_train_batch(batch, seq_ids=None):
        tb = to_train_batch(batch, seq_ids)
        batches.append((batch, tb))
        return tb

    monkeypatch.setattr(Batcher, "generate", recording_generate)
    monkeypatch.setattr(credit, "to_train_batch", recording_to_train_batch)
    # two PPO epochs keep the old-log-prob pass (an exactly on-policy update skips it), whose log-probs of the
    # sampled tokens are compared with the engine's below
    cfg = load_train_config("base", _overrides(tmp_path, f"env.config.entry={__name__}:flaky_calculator",
                                               f"agent.layout={layout}", "actor.ppo_epochs=2"))
    run(cfg)

    assert len(batches) == 2
    engine = {(p, s): lp for p, s, lp in sampled}
    trained_runs = 0
    for batch, tb in batches:
        assert torch.equal(tb.input_ids, batch.input_ids) and torch.equal(tb.response_mask, batch.response_mask)
        assert batch.failed.tolist().count(True) == 1  # the one run that raised; the others train
        for i in range(tb.batch_size):
            for a, b in _runs(batch.turn_ids[i]):
                key = (tuple(tb.input_ids[i, :a].tolist()), tuple(tb.input_ids[i, a:b].tolist()))
                assert key in engine, "a trained token the engine did not sample after that prompt"
                assert batch.sample_log_probs[i, a:b].tolist() == pytest.approx(list(engine[key]), abs=0)
                trained_runs += 1
        episodes = {id(ep): ep for ep in batch.episodes}.values()
        assert [ep.failed for ep in episodes].count(True) == 1
        assert "the program broke" in next(ep for ep in episodes if ep.failed).error
    # every call of an episode that did not fail is trained (each call: one sample, one run of model tokens)
    calls = sum(len(ep.turns) for batch, _ in batches for ep in {id(e): e for e in batch.episodes}.values()
                if not ep.failed)
    assert trained_runs == calls > 0

    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["gateway/failed_episodes"] == 1.0 and r["rollout/env_errors"] == 1.0
        assert r["gateway/forks"] == 0.0  # the default template re-renders nothing: every later call merges
        assert r["gateway/merged_turns"] == r["gateway/calls"] - 4
        assert r["rollout/logprob_diff_max"] < 1e-4  # the trainer's log-probs of those tokens are the engine's
    final, init = load_actor_weights(tmp_path / "checkpoints" / "global_step_2"), tiny_init_weights()
    assert any(not torch.equal(final[k], init[k]) for k in init)


def test_a_bad_entry_fails_before_the_start(tmp_path):
    from ragen.launch import validate
    from ragen.trainer.config.compose import load_train_config
    from ragen.trainer.config.schema import ConfigError

    cases = {"no_such_module_xyz:run": "cannot be imported", f"{__name__}:missing": "has no attribute",
             f"{__name__}:_LOCK": "not callable", "no_colon": "not of the form module:function"}
    for entry, why in cases.items():
        with pytest.raises(ConfigError) as err:
            validate(load_train_config("base", _overrides(tmp_path, f"env.config.entry={entry}")))
        text = str(err.value)
        assert f"env.config.entry={entry!r}" in text and why in text and "set env.config.entry=" in text, text
    with pytest.raises(ConfigError, match="env.config.tool_parser='xml' is unknown"):
        validate(load_train_config("base", _overrides(tmp_path, f"env.config.entry={__name__}:flaky_calculator",
                                                      "env.config.tool_parser=xml")))
    from ragen.trainer.config.unread_keys import explicit_keys

    with explicit_keys(["agent.think"]), pytest.raises(ConfigError, match="agent.think=false has no effect"):
        validate(load_train_config("base", _overrides(tmp_path, f"env.config.entry={__name__}:flaky_calculator",
                                                      "agent.think=false")))
    with pytest.raises(ConfigError, match="rollout.val_envs names agent_program"):
        validate(load_train_config("base", _overrides(
            tmp_path, "rollout.val_envs=[{name: agent_program, n_groups: 1, config: {entry: 'x:y'}}]", env="bandit")))


def test_a_bad_format_penalty_fails_before_the_start(tmp_path):
    from ragen.launch import validate
    from ragen.trainer.config.compose import load_train_config
    from ragen.trainer.config.schema import ConfigError
    from ragen.trainer.config.unread_keys import explicit_keys

    entry = f"env.config.entry={__name__}:flaky_calculator"
    for value, shown in (("0.5", "0.5"), ("high", "'high'"), ("true", "True")):
        with pytest.raises(ConfigError) as err:
            validate(load_train_config("base", _overrides(tmp_path, entry, f"env.config.format_penalty={value}")))
        assert f"env.config.format_penalty={shown} must be a finite number <= 0" in str(err.value)
        assert "set e.g. env.config.format_penalty=-0.1" in str(err.value)
    validate(load_train_config("base", _overrides(tmp_path, entry, "env.config.format_penalty=-1")))
    why = "agent.format_penalty=-0.5 has no effect: .*is env.config.format_penalty; set that instead"
    with explicit_keys(["agent.format_penalty"]), pytest.raises(ConfigError, match=why):
        validate(load_train_config("base", _overrides(tmp_path, entry, "agent.format_penalty=-0.5")))


def test_a_warm_start_imitates_the_programs_expert(tmp_path):
    """``trainer.sft_warmup_steps`` with ``env.config.expert``: the warm start plays the program against the expert
    (every episode solved, two calls each), trains on it, and RL follows; without the expert, or with one that does
    not import, the run is refused before the start."""
    from ragen.launch import run, validate
    from ragen.trainer.config.compose import load_train_config
    from ragen.trainer.config.schema import ConfigError

    calc = "ragen.gateway.examples.calculator"
    entry, expert = f"env.config.entry={calc}:run", f"env.config.expert={calc}:expert"
    over = [*_overrides(tmp_path, entry, expert, "agent.max_new_tokens=64"), "trainer.sft_warmup_steps=2"]
    run(load_train_config("base", over))
    records = read_metrics(tmp_path)
    sft = [r for r in records if "sft/step" in r]
    assert [r["sft/step"] for r in sft] == [1.0, 2.0]
    assert all(r["sft/env/agent_program/success"] == 1.0 and r["sft/env/agent_program/turns"] == 2.0 for r in sft)
    assert sft[1]["sft/nll"] < sft[0]["sft/nll"]
    assert [r["step"] for r in records if "actor/pg_loss" in r] == [1, 2]
    with pytest.raises(ConfigError, match="trainer.sft_warmup_steps=2 needs an env with an expert: for "
                                          "env=agent_program set env.config.expert="):
        validate(load_train_config("base", [*_overrides(tmp_path, entry), "trainer.sft_warmup_steps=2"]))
    with pytest.raises(ConfigError, match="env.config.expert='no_such_module:expert'.* cannot be imported"):
        validate(load_train_config("base", [*over, "env.config.expert=no_such_module:expert"]))
    from ragen.trainer.config.unread_keys import explicit_keys

    with explicit_keys(["sft.noise"]), pytest.raises(ConfigError, match="sft.noise=0.5 has no effect: the program's "
                                                                         "expert"):
        validate(load_train_config("base", [*over, "sft.noise=0.5"]))
