"""Registry behaviour and the config/env/*.yaml files of the four core envs."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import ragen.env as E
from ragen.env.base import REQUIRED_INFO_KEYS

CORE_ENVS = ["bandit", "frozen_lake", "sokoban", "countdown"]
CONFIG_DIR = Path(__file__).resolve().parents[2] / "config" / "env"


def test_names_include_core_envs():
    assert set(CORE_ENVS) <= set(E.names())
    assert E.names() == sorted(E.names())


def test_unknown_name_lists_registered_envs():
    with pytest.raises(ValueError) as err:
        E.make("sokobann")
    message = str(err.value)
    assert "'sokobann'" in message
    for name in CORE_ENVS:
        assert name in message


def test_unknown_config_key_lists_valid_keys():
    with pytest.raises(ValueError) as err:
        E.make("sokoban", dim_rooms=(6, 6))
    message = str(err.value)
    assert "dim_rooms" in message
    for key in ("dim_room", "num_boxes", "search_depth", "max_steps"):
        assert key in message


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("bandit", ["low_arm", "high_arm", "low_payout", "high_payout", "high_prob"]),
        ("frozen_lake", ["size", "p", "is_slippery", "max_steps"]),
        ("sokoban", ["dim_room", "num_boxes", "search_depth", "max_steps"]),
        ("countdown", ["num_numbers", "min_number", "max_number", "max_target"]),
    ],
)
def test_config_keys(name, keys):
    assert E.config_keys(name) == keys


@pytest.mark.parametrize("name", CORE_ENVS)
def test_yaml_config_builds_env_that_follows_protocol(name):
    cfg = OmegaConf.load(CONFIG_DIR / f"{name}.yaml")
    assert cfg.name == name
    assert cfg.max_turn >= 1 and cfg.max_actions_per_turn >= 1
    config = OmegaConf.to_container(cfg.config)
    assert set(config) == set(E.config_keys(name))  # the yaml documents every option
    env = E.make(name, **config)
    assert isinstance(env, E.Env)
    obs = env.reset(seed=0)
    assert isinstance(obs, str) and obs
    assert isinstance(env.instructions, str) and env.instructions
    assert isinstance(env.legal_actions(), str) and env.legal_actions()
    result = env.step("definitely not an action")
    assert isinstance(result, E.StepResult)
    assert set(REQUIRED_INFO_KEYS) <= set(result.info)
    assert result.info["action_is_valid"] is False
    assert result.reward == 0.0


@pytest.mark.parametrize("name", CORE_ENVS)
def test_step_before_reset_is_a_clear_error(name):
    env = E.make(name)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Up")


@pytest.mark.parametrize(
    ("name", "config", "fragment"),
    [
        ("bandit", {"low_arm": "Dragon", "high_arm": "dragon"}, "arm names"),
        ("bandit", {"high_prob": 1.5}, "high_prob"),
        ("frozen_lake", {"size": 1}, "size"),
        ("frozen_lake", {"p": 0.0}, "p "),
        ("sokoban", {"dim_room": (3, 6)}, "dim_room"),
        ("sokoban", {"num_boxes": 0}, "num_boxes"),
        ("countdown", {"num_numbers": 7}, "num_numbers"),
        ("countdown", {"max_number": 100, "max_target": 50}, "max_target"),
    ],
)
def test_bad_config_values_name_the_option(name, config, fragment):
    with pytest.raises(ValueError, match=fragment):
        E.make(name, **config)
