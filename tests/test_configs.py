"""Every file under config/ composes into a valid TrainConfig; base.yaml's defaults equal the schema's."""

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ragen.launch import validate
from ragen.trainer.config.compose import compose, config_dir, to_train_config
from ragen.trainer.config.ppo_checks import STEP_SPLIT_ESTIMATORS
from ragen.trainer.config.schema import SECTIONS, ConfigError, TrainConfig, default_section_values

CONFIG = config_dir()
GAME = "env.config.game_path=/data/games/detective.z5"  # text_adventure's required file (never opened)
PRIMARY = sorted(p.stem for p in CONFIG.glob("*.yaml"))
# recipe/ options are chosen by the experiment configs per device (tests/test_recipes.py), not composed on base;
# preset/ options are appended to any config (+preset=<name>; test_presets_compose_last_on_every_config)
GROUP_OPTIONS = sorted((d.name, p.stem) for d in CONFIG.iterdir() if d.is_dir() and d.name not in ("recipe", "preset")
                       for p in d.glob("*.yaml"))
PRESETS = sorted(p.stem for p in (CONFIG / "preset").glob("*.yaml"))


def test_config_tree_is_found():
    assert {"base", "ppo_bandit", "ppo_multi_turn", "ppo_bilevel"} <= set(PRIMARY)
    groups = {g for g, _ in GROUP_OPTIONS}
    assert {"algorithm", "env", "model", "trainer"} <= groups


@pytest.mark.parametrize("name", PRIMARY)
def test_primary_configs_compose_and_validate(name):
    composed = compose(name)
    missing = sorted(k for k in OmegaConf.missing_keys(composed) if not k.startswith("hydra."))
    if missing:  # e.g. archer_text_adventure: the user supplies the game file; the error names the key
        with pytest.raises(ConfigError, match=f"{missing[0]} is required"):
            to_train_config(composed)
        return
    cfg = to_train_config(composed)
    assert isinstance(cfg, TrainConfig)
    validate(cfg)


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_group_options_compose(group, option):
    overrides = [f"{group}={option}"]
    if group == "trainer" and option == "gpu":
        cfg = to_train_config(compose("base", overrides))  # needs GPUs to validate
        assert cfg.trainer.device == "cuda" and cfg.rollout.engine == "vllm"
        return
    if group == "algorithm" and option in STEP_SPLIT_ESTIMATORS:  # they need an env with a step/outcome split
        overrides.append("env=search_qa")
    composed = compose("base", overrides)
    missing = sorted(OmegaConf.missing_keys(composed))
    if missing:  # e.g. a data path the user must give: a clear error names it
        with pytest.raises(ConfigError, match=f"{missing[0]} is required"):
            to_train_config(composed)
        return
    cfg = to_train_config(composed)
    if group == "env":  # long-horizon envs need room for every turn of the trajectory
        cfg = to_train_config(compose("base", [*overrides, "agent.max_new_tokens=32", "agent.max_model_len=8192"]))
    validate(cfg)
    if group == "algorithm":
        assert cfg.algorithm.estimator == option
    if group == "env":  # the file's env (frozen_lake_3x3.yaml is frozen_lake on 3x3 maps)
        assert cfg.env.name == OmegaConf.load(CONFIG / "env" / f"{option}.yaml").name


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", PRIMARY)
def test_presets_compose_last_on_every_config(name, preset):
    """``+preset=<p>`` composes on every config and validates; its values win over the config's recipe and the keys
    typed beside it win over the preset."""
    extra = [GAME] if name == "archer_text_adventure" else []
    raw = OmegaConf.load(CONFIG / "preset" / f"{preset}.yaml")
    cfg = to_train_config(compose(name, [f"+preset={preset}", *extra]))
    if not extra:  # text_adventure's env opens its game file when validated
        validate(cfg)
    for section, values in OmegaConf.to_container(raw).items():
        for key, value in (values.items() if section != "defaults" else ()):
            assert getattr(getattr(cfg, section), key) == value, key
    if preset == "tiny":
        assert cfg.model.tiny and cfg.rollout.n_groups == 2
        typed = to_train_config(compose(name, [f"+preset={preset}", "rollout.n_groups=3", *extra]))
        assert typed.rollout.n_groups == 3


def _resolved_base() -> dict:
    raw = OmegaConf.load(Path(CONFIG) / "base.yaml")
    del raw["defaults"], raw["hydra"]
    unresolved = OmegaConf.to_container(raw, resolve=False)
    resolved = OmegaConf.to_container(raw, resolve=True)
    return unresolved, resolved


def test_base_yaml_defaults_equal_schema_defaults():
    unresolved, resolved = _resolved_base()
    assert set(unresolved) == {*SECTIONS, "imports"} and unresolved["imports"] == TrainConfig().imports == []
    for section in SECTIONS:
        expected = default_section_values(section)
        assert set(unresolved[section]) == set(expected), section
        for key, value in expected.items():
            yaml_value = unresolved[section][key]
            if isinstance(yaml_value, str) and "${" in yaml_value and not (isinstance(value, str) and "${" in value):
                yaml_value = resolved[section][key]
            assert yaml_value == value, f"{section}.{key}: base.yaml has {yaml_value!r}, schema has {value!r}"


def test_overrides_reach_the_frozen_config():
    cfg = to_train_config(compose("ppo_bandit", ["trainer.total_steps=3", "actor.lr=2e-5", "model=tiny"]))
    assert cfg.trainer.total_steps == 3 and cfg.actor.lr == 2e-5 and cfg.model.tiny
    assert cfg.critic.share_backbone is True and cfg.env.name == "bandit"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.trainer.total_steps = 5  # type: ignore[misc]


def test_launch_configs_select_their_experiment():
    multi = to_train_config(compose("ppo_multi_turn"))
    assert (multi.env.name, multi.algorithm.estimator, multi.algorithm.skip_env_tokens) == ("frozen_lake", "gae", True)
    bilevel = to_train_config(compose("ppo_bilevel"))
    assert (bilevel.env.name, bilevel.algorithm.estimator) == ("frozen_lake", "bilevel_gae")
    for cfg in (multi, bilevel):  # the task and recipe the README's learning table measures
        assert (cfg.env.config["size"], cfg.sft.noise, cfg.trainer.sft_warmup_steps, cfg.sft.epochs) == (3, 1.0, 2, 3)
        assert (cfg.trainer.total_steps, cfg.trainer.val_freq, cfg.rollout.val_n_groups) == (8, 0, 32)
        assert (cfg.env.max_turn, cfg.env.max_actions_per_turn, cfg.agent.reminder) == (3, 5, "first_turn")
        assert cfg.actor.lr == 5e-5
        assert cfg.critic.share_backbone and not cfg.trainer.use_ray


def test_precision_defaults_are_auto():
    cfg = to_train_config(compose("base"))
    assert (cfg.actor.mixed_precision, cfg.critic.mixed_precision, cfg.rollout.dtype) == ("auto", "auto", "auto")
    assert cfg.critic.worker_config().mixed_precision == "auto"  # resolved by the workers, never in the config


def test_validation_decodes_greedily_by_default(default_tokenizer):
    """rollout.val_temperature=0 (default) builds a greedy validation proxy; training keeps agent.temperature;
    null means agent.temperature. A greedy validation rollout runs and is deterministic."""
    from ragen.models import tiny_model
    from ragen.rollout.hf import HFEngine
    from ragen.trainer.builders import build_proxies

    cfg = to_train_config(compose("base", ["rollout.val_n_groups=2", "agent.max_new_tokens=6"]))
    assert cfg.rollout.val_temperature == 0.0
    engine = HFEngine(tiny_model(tokenizer=default_tokenizer, seed=0), default_tokenizer)
    train, val = build_proxies(cfg, engine, default_tokenizer)
    assert train.cfg.temperature == cfg.agent.temperature == 1.0 and val.cfg.temperature == 0.0
    first, again = val.rollout("val"), val.rollout("val")
    assert first.input_ids.shape[0] == 2 and first.input_ids.equal(again.input_ids)
    _, same = build_proxies(to_train_config(compose("base", ["rollout.val_temperature=null"])), engine,
                            default_tokenizer)
    assert same.cfg.temperature == 1.0


def test_nested_sections_are_built_and_type_checked_by_key():
    """rollout.vllm is a nested section: its mapping becomes a VLLMSection, and a wrong type names the nested key."""
    cfg = to_train_config(compose("ppo_bandit", ["rollout.vllm.max_num_seqs=8"]))
    assert cfg.rollout.vllm.max_num_seqs == 8 and cfg.rollout.vllm.placement == "colocated"
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.max_num_seqs='abc' has the wrong type: expected int"):
        to_train_config(compose("ppo_bandit", ["rollout.vllm.max_num_seqs=abc"]))


def test_config_dir_prefers_the_variable_then_the_checkout_then_the_installed_copy(tmp_path, monkeypatch):
    """``$RAGEN_CONFIG_DIR``, else the checkout's config/ (next to the ragen package), else the copy a wheel
    installs as the package ``ragen_config``: an installed ragen finds its configs outside any checkout."""
    from ragen.trainer.config import compose as C

    own = tmp_path / "mine"
    own.mkdir()
    (own / "base.yaml").write_text("")
    monkeypatch.setenv("RAGEN_CONFIG_DIR", str(own))
    assert C.config_dir() == own.resolve()
    monkeypatch.delenv("RAGEN_CONFIG_DIR")
    assert C.config_dir() == Path(C.__file__).resolve().parents[3] / "config" == CONFIG
    installed = tmp_path / "site" / "ragen_config"
    installed.mkdir(parents=True)
    (installed / "base.yaml").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(C, "__file__", str(tmp_path / "site" / "ragen" / "trainer" / "compose.py"))  # no checkout
    assert C.config_dir() == installed


def _script(name: str):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_base_and_env_yaml_are_generated_from_the_code_that_owns_the_defaults():
    """config/base.yaml renders the schema dataclasses' defaults and config/env/<env>.yaml an env class's
    (scripts/config_yaml.py): a default edited in the YAML alone, or in the code without rerunning the script, fails
    here."""
    gen = _script("config_yaml")
    files = gen.rendered()
    assert CONFIG / "base.yaml" in files and CONFIG / "env" / "frozen_lake.yaml" in files and len(files) == 13
    for path, text in files.items():
        assert path.read_text() == text, f"{path.name} is stale: run `python scripts/config_yaml.py`"
    assert "actor.temperature" in gen.LINKS and gen.scalar(1e-6) == "1.0e-06" and gen.scalar("||") == "'||'"


def test_env_variants_inherit_their_env_and_set_only_what_differs():
    """A file of config/env/ not named after an env is a variant: it inherits the env's file and writes no key with the
    value it inherits (``name`` says which env it is), so each env default is written once."""
    import ragen.env

    variants = sorted(p for p in (CONFIG / "env").glob("*.yaml") if p.stem not in ragen.env.names())
    assert [p.stem for p in variants] == ["agent_program_calculator", "bandit_sure", "frozen_lake_3x3",
                                          "twenty_questions_small"]
    for path in variants:
        own = OmegaConf.to_container(OmegaConf.load(path))
        assert own.pop("defaults") == [own["name"], "_self_"], path.name
        parent = OmegaConf.to_container(OmegaConf.load(CONFIG / "env" / f"{own.pop('name')}.yaml"))
        same = [k for k, v in own.items() if k != "config" and parent[k] == v]
        same += [f"config.{k}" for k, v in own.get("config", {}).items() if parent["config"][k] == v]
        assert not same, f"{path.name} restates {same}"
        composed = to_train_config(compose("base", [f"env={path.stem}"])).env
        assert composed.config == {**parent["config"], **own.get("config", {})}


def test_random_warm_start_actions_need_an_env_that_lists_them():
    """A format-only warm start (``sft.noise`` > 0, the multi-turn CPU recipe) on a free-text env would demonstrate
    pieces of its legal-actions description as answers; it is refused before anything starts, naming the fix."""
    for env in ("twenty_questions_small", "countdown"):
        with pytest.raises(ConfigError, match=r"sft.noise=1.0 makes the warm start play random legal actions, but env "
                           r"'\w+' takes free-text actions .* set sft.noise=0"):
            validate(to_train_config(compose("ppo_multi_turn", [f"env={env}"])))
        validate(to_train_config(compose("ppo_multi_turn", [f"env={env}", "sft.noise=0"])))  # the expert's answers
        validate(to_train_config(compose("ppo_multi_turn", [f"env={env}", "trainer.sft_warmup_steps=0"])))
    validate(to_train_config(compose("ppo_multi_turn", ["env=sokoban"])))  # a listed action set
