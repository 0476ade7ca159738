"""``--check`` plays one step of every env of a run (``ragen.env.base.smoke_test``): an env that returns a tuple from
``step``, lacks ``legal_actions``, raises, or returns the reward ``"0"`` is refused before anything starts, with the
env and the reason named, instead of failing every episode of a run that exits 0."""

from __future__ import annotations

import dataclasses

import broken_envs  # noqa: F401 - registers the smoke_* envs
import pytest

import ragen.env
from ragen.env.base import smoke_test
from ragen.launch import validate
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError, EnvSection
from ragen.trainer.dry_run import dry_run

CASES = {
    "smoke_tuple_step": "step('yes'): step returned tuple, not StepResult",
    "smoke_no_legal_actions": "it has no legal_actions() method",
    "smoke_step_raises": "step('yes') raised KeyError",
    "smoke_string_reward": "step('yes'): reward '0' is not a finite number",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_smoke_test_names_the_defect(name):
    assert [p for p in smoke_test(ragen.env.make(name), 3) if CASES[name] in p], smoke_test(ragen.env.make(name), 3)


def test_working_envs_pass():
    assert smoke_test(ragen.env.make("smoke_fine"), 0) == []
    for name in ("bandit", "frozen_lake", "sokoban", "countdown", "delayed_choice", "twenty_questions"):
        assert smoke_test(ragen.env.make(name), 7) == [], name


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_refuses_a_broken_env(name, tmp_path):
    cfg = load_train_config("ppo_bandit", ["model=tiny", f"trainer.output_dir={tmp_path / 'run'}",
                                           "trainer.sft_warmup_steps=0", "trainer.dry_run=true"])
    cfg = dataclasses.replace(cfg, env=EnvSection(name=name))
    with pytest.raises(ConfigError) as info:
        dry_run(cfg, validate)
    message = str(info.value)
    assert f"env {name} breaks the env protocol" in message and CASES[name] in message
    assert not (tmp_path / "run").exists()  # nothing was written
