"""Fuzzed config overrides: random keys, wrong types, negative sizes, NaN, huge numbers -> the config
builds, or one readable ``ConfigError`` naming the key; never an exception from deep inside a check."""

import copy
import random

import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ragen.launch import validate
from ragen.trainer.config.compose import compose, load_train_config, to_train_config
from ragen.trainer.config.schema import SECTIONS, ConfigError, default_section_values

VALUES = ["abc", "-1", "-100", "0", "1e308", ".nan", ".inf", "-.inf", "[1, 2]", "{a: 1}", "null", "true", "3.5",
          "''", "99999999999999999999", "-0.5", "[]", "[abc]", "1"]
# the key an error names when the override sets a key another one interpolates (base.yaml: actor.temperature:
# ${agent.temperature})
ALIASES = {"agent.temperature": ("actor.temperature",)}
KEYS = [f"{s}.{k}" for s in SECTIONS if s != "env" for k in default_section_values(s)] + [
    "env.max_turn", "env.max_actions_per_turn", "env.name"]
UNKNOWN = ["trainer.totl_steps", "actor.learning_rate", "agent.max_turns", "nosuch.key", "rollout.n", "critic.x"]


def _attempt(base, overrides: dict[str, str]) -> str:
    """'ok', or 'error: <message>' for a ConfigError / an OmegaConf merge error; anything else propagates."""
    cfg = copy.deepcopy(base)
    try:
        for key, value in overrides.items():
            OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
        validate(to_train_config(cfg))
    except (ConfigError, OmegaConfBaseException) as exc:  # what ragen.train prints (exit 2) / what Hydra reports
        return f"error: {exc}"
    return "ok"


def _named(message: str, key: str) -> bool:
    return any(k in message for k in (key, *ALIASES.get(key, ())))


def test_single_fuzzed_overrides_fail_with_the_key_named():
    """150 random single overrides of known and unknown keys: each one builds, or its error names the key."""
    rng = random.Random(13)
    base = compose("base", [])
    counts = {"ok": 0, "error": 0}
    for _ in range(150):
        key = rng.choice(UNKNOWN) if rng.random() < 0.1 else rng.choice(KEYS)
        value = rng.choice(VALUES)
        outcome = _attempt(base, {key: value})
        counts[outcome.split(":")[0]] += 1
        if outcome != "ok":
            assert _named(outcome, key), (key, value, outcome)
            assert "Traceback" not in outcome and len(outcome) < 4000
    assert counts["ok"] >= 10 and counts["error"] >= 90, counts


def test_multi_key_fuzz_only_raises_config_errors():
    """50 random sets of 2-4 overrides: a ConfigError (or an OmegaConf merge error) or a valid config, nothing else;
    every wrongly typed value among them is named."""
    rng = random.Random(7)
    base = compose("base", [])
    for _ in range(50):
        overrides = {rng.choice(KEYS): rng.choice(VALUES) for _ in range(rng.randint(2, 4))}
        outcome = _attempt(base, overrides)
        assert outcome == "ok" or outcome.startswith("error: ")
        for key, value in overrides.items():
            if value == "abc" and _annotation(key) in ("int", "float", "bool", "int | None", "float | None"):
                assert f"{key}='abc' has the wrong type" in outcome, (overrides, outcome)


def _annotation(key: str) -> str | None:
    from dataclasses import fields

    section, name = key.split(".", 1)
    return next((str(f.type) for f in fields(SECTIONS[section]) if f.name == name), None)


@pytest.mark.parametrize(("override", "expected"), [
    ("trainer.total_steps=abc", "trainer.total_steps='abc' has the wrong type: expected int"),
    ("rollout.n_groups=-2", "rollout.n_groups"),
    ("actor.lr=nan", "actor.lr=nan has the wrong type: expected float"),
    ("actor.betas=[0.9]", "actor.betas=[0.9] has the wrong type: expected tuple[float, float]"),
    ("trainer.loggers=[console,1]", "trainer.loggers=['console', 1] has the wrong type: expected list[str]"),
    ("agent.max_new_tokens=-5", "max_new_tokens"),
    ("+trainer.totl_steps=3", "trainer.totl_steps"),
])
def test_hydra_overrides_name_the_key(override, expected):
    with pytest.raises(ConfigError) as err:
        validate(load_train_config("base", [override]))
    assert expected in str(err.value)
