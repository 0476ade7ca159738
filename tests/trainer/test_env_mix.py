"""Several envs in one run (rollout.train_envs / val_envs): config errors, seeds per env, and a tiny run that trains
on bandit + frozen_lake groups, validates on both plus a validation-only env, and reports each."""

import json

import pytest
from trainer_helpers import assert_all_finite, read_metrics, tiny_overrides

from ragen.agent import AgentConfig, EnvGroupSpec
from ragen.agent.env_manager import EnvManager
from ragen.launch import run, validate
from ragen.trainer.config import env_mix
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.run_shape import train_batch_size
from ragen.trainer.config.schema import ConfigError

MIX = ["rollout.train_envs=[{name: bandit, n_groups: 1},{name: frozen_lake, n_groups: 2, max_turn: 2}]"]


def test_mix_resolves_each_env_from_its_config_file(tmp_path):
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path), *MIX])
    train = env_mix.train_groups(cfg)
    assert [(g.env.name, g.n_groups, g.env.max_turn, g.env.max_actions_per_turn) for g in train] == [
        ("bandit", 1, 1, 1), ("frozen_lake", 2, 2, 5)]  # frozen_lake.yaml: 5 actions a turn; max_turn overridden
    assert train[1].env.config["size"] == 4  # config/env/frozen_lake.yaml
    assert env_mix.n_train_groups(cfg) == 3 and env_mix.max_turns(cfg) == 2
    assert train_batch_size(cfg) == 3 * cfg.rollout.group_size
    val = env_mix.val_groups(cfg)  # no val_envs: every training env with rollout.val_n_groups
    assert [(g.env.name, g.n_groups) for g in val] == [("bandit", 2), ("frozen_lake", 2)]
    single = load_train_config("ppo_bandit", tiny_overrides(tmp_path))
    assert [(g.env, g.n_groups) for g in env_mix.train_groups(single)] == [(single.env, single.rollout.n_groups)]


@pytest.mark.parametrize(("entries", "message"), [
    ("[{name: no_such_env, n_groups: 1}]", "rollout.train_envs[0].name: no config/env/no_such_env.yaml"),
    ("[{name: bandit, n_groups: 0}]", "rollout.train_envs[0].n_groups=0 must be an integer >= 1"),
    ("[{name: bandit}]", "rollout.train_envs[0]="),
    ("[{name: bandit, n_groups: 1, colour: red}]", "unknown key(s) ['colour']"),
    ("[{name: bandit, n_groups: 1},{name: bandit, n_groups: 2}]", "names env(s) ['bandit'] more than once"),
    ("[{name: frozen_lake, n_groups: 1, config: {sise: 4}}]", "sise"),
])
def test_bad_entries_fail_before_anything_starts(tmp_path, entries, message):
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(tmp_path), f"rollout.train_envs={entries}"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert message in str(err.value)


def test_each_env_keeps_its_own_seeds():
    """Group g of an env plays base + counter * n_groups + g whatever else is in the batch (validation: base + g,
    the seeds ragen.eval plays)."""
    agent = AgentConfig(max_turn=1)
    alone = EnvManager([EnvGroupSpec("frozen_lake", {}, n_groups=2)], agent)
    mixed = EnvManager([EnvGroupSpec("bandit", {}, n_groups=3), EnvGroupSpec("frozen_lake", {}, n_groups=2)], agent)
    for counter in (0, 5):
        assert mixed.group_seeds(100, counter)[3:] == alone.group_seeds(100, counter)
    assert mixed.group_seeds(100, 1) == [103, 104, 105, 102, 103]


@pytest.mark.slow
def test_a_mixed_run_trains_and_reports_every_env(tmp_path):
    val = "rollout.val_envs=[{name: bandit, n_groups: 2},{name: frozen_lake, n_groups: 1, max_turn: 2}," \
          "{name: countdown, n_groups: 1}]"
    overrides = [*tiny_overrides(tmp_path, 1), *MIX, val, "trainer.use_ray=false", "actor.mini_batch_size=6",
                 "critic.mini_batch_size=6", "actor.micro_batch_size=3", "critic.micro_batch_size=3"]
    metrics = run(load_train_config("ppo_bandit", overrides))
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    step1 = next(r for r in records if r["step"] == 1)
    for env in ("bandit", "frozen_lake"):  # trained on both, with per-env metrics
        assert f"env/{env}/success" in step1 and f"env/{env}/format_ok" in step1
    assert "env/countdown/success" not in step1
    for env in ("bandit", "frozen_lake", "countdown"):  # validated on all three
        assert f"val/env/{env}/success" in metrics
    episodes = [json.loads(line) for line in (tmp_path / "val_rollouts" / "step_1.jsonl").read_text().splitlines()]
    by_env = {}
    for ep in episodes:
        by_env.setdefault(ep["env"], []).append(ep["seed"])
    assert by_env == {"bandit": [100000, 100001], "frozen_lake": [100000], "countdown": [100000]}
    assert all(len(ep["turns"]) <= 2 for ep in episodes if ep["env"] == "frozen_lake")
    page = (tmp_path / "report" / "step_1.html").read_text()
    assert all(env in page for env in ("bandit", "frozen_lake", "countdown"))


def test_a_variant_env_file_brings_its_env_defaults():
    """``frozen_lake_3x3.yaml`` writes only what differs from ``frozen_lake.yaml`` (size, max_turn); an entry naming it
    gets the rest from the env's file, as ``env=frozen_lake_3x3`` does."""
    from ragen.trainer.config.env_mix import _env_file

    assert _env_file("frozen_lake_3x3") == {"name": "frozen_lake", "max_turn": 3, "max_actions_per_turn": 5,
                                            "config": {"size": 3, "p": 0.8, "is_slippery": False, "max_steps": 100}}
