"""The preflight registry: checks declare what they read and what they run after; engines are added in one place."""

from dataclasses import asdict, fields, replace
from types import SimpleNamespace

import pytest

from ragen.launch import validate
from ragen.trainer.config import preflight
from ragen.trainer.config.compose import compose, to_train_config
from ragen.trainer.config.schema import SECTIONS, ConfigError

PINNED = ["rollout.n_groups=4", "rollout.group_size=4", "actor.mini_batch_size=8", "actor.micro_batch_size=2",
          "critic.mini_batch_size=8", "critic.micro_batch_size=2"]


def _cfg(*overrides):
    return to_train_config(compose("base", [*PINNED, *overrides]))


def test_every_check_declares_keys_that_exist_and_dependencies_that_are_registered():
    import ragen.archer.main  # noqa: F401  (registers the ArCHer family's checks)
    import ragen.trainer.config.ppo_checks  # noqa: F401  (registers the PPO family's checks)

    names = set(preflight.CHECKS)
    assert {"env", "trainer", "world_sizes", "groups", "agent_config", "env_mix", "algorithm", "inert", "batches",
            "credit", "archer"} <= names
    for check in preflight.CHECKS.values():
        assert set(check.after) <= names, check.name
        assert check.reads, check.name
        for key in check.reads:
            section, _, rest = key.partition(".")
            assert section in SECTIONS, (check.name, key)
            if rest:
                assert rest.split(".")[0] in {f.name for f in fields(SECTIONS[section])}, (check.name, key)
    for family in ("ppo", "archer"):
        order = [c.name for c in preflight.ordered(family)]
        for check in preflight.ordered(family):
            assert all(order.index(d) < order.index(check.name) for d in check.after if d in order), check.name


@pytest.fixture
def scratch(monkeypatch):
    """An empty registry with a family ``toy`` (the real registrations are put back afterwards)."""
    monkeypatch.setattr(preflight, "CHECKS", {})
    monkeypatch.setattr(preflight, "FAMILIES", {})
    preflight.register_family("toy", ("ppo",))


def test_a_check_runs_only_after_the_checks_it_names_passed(scratch):
    ran = []

    def check(name, problems):
        def fn(cfg):
            ran.append(name)
            return problems
        return fn

    # registered before its dependency: the order comes from `after`, not from registration
    preflight.register("shape", reads=("actor",), after=("sizes",), families=("toy",))(check("shape", ["bad shape"]))
    preflight.register("sizes", reads=("trainer",), families=("toy",))(check("sizes", ["bad size"]))
    preflight.register("later", reads=("actor",), after=("shape",), families=("toy",))(check("later", []))
    preflight.register("other", reads=("env",), families=("toy",))(check("other", ["bad env"]))
    cfg = _cfg()
    with pytest.raises(ConfigError) as info:
        preflight.preflight(cfg)
    assert info.value.problems == ["bad size", "bad env"]  # shape skipped, and so is `later`, which waits on it
    assert ran == ["sizes", "other"]
    preflight.register("sizes", reads=("trainer",), families=("toy",))(check("sizes", []))
    ran.clear()
    assert preflight.problems(cfg) == ["bad shape", "bad env"]
    assert ran == ["sizes", "shape", "other"]  # `later` waits on shape, which failed


def test_a_cycle_of_dependencies_is_named(scratch):
    preflight.register("a", reads=("actor",), after=("b",), families=("toy",))(lambda cfg: [])
    preflight.register("b", reads=("actor",), after=("a",), families=("toy",))(lambda cfg: [])
    with pytest.raises(RuntimeError, match=r"checks \['a', 'b'\] wait on each other"):
        preflight.problems(_cfg())


def test_batch_shapes_wait_for_valid_world_sizes():
    """An unusable world size is reported once, by its own check, without a batch message built on it."""
    cfg = _cfg("trainer.use_ray=false", "trainer.actor_world_size=2")
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert info.value.problems == ["trainer.actor_world_size=2 needs Ray; set trainer.use_ray=true or the world "
                                   "size to 1"]
    assert any("must be a multiple of the actor world size 3" in p
               for p in preflight.CHECKS["batches"].fn(_cfg("trainer.actor_world_size=3")))


def test_agent_value_checks_name_the_config_keys_beside_other_problems():
    """The agent proxy's checks name agent.* / env.* keys and are reported together with the other problems."""
    cfg = _cfg("agent.reminder=never", "agent.action_sep=", "algorithm.kl_kind=k9")
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert "agent.reminder must be one of ('every_turn', 'first_turn'), got 'never'" in info.value.problems
    assert "agent.action_sep must be a non-empty string such as '||'" in info.value.problems
    assert "algorithm.kl_kind='k9' is unknown; use one of ('k1', 'k2', 'k3')" in info.value.problems
    assert not any("AgentConfig" in p for p in info.value.problems)


class FakeEngine:
    """An engine the run layer has never heard of: it records its constructor's arguments."""

    def __init__(self, model, tokenizer, device, dtype, seed, flavour):
        self.kwargs = {"model": model, "tokenizer": tokenizer, "device": device, "dtype": dtype, "seed": seed,
                       "flavour": flavour}


@pytest.fixture
def fake_engine():
    from ragen.rollout.registry import EngineEntry, register_engine, unregister_engine

    entry = register_engine(EngineEntry("fake", FakeEngine, label="fake",
                                        options=lambda section, ctx: {"seed": ctx.seed, "flavour": "plain"}))
    yield entry
    unregister_engine("fake")


def test_an_engine_registered_in_one_place_is_accepted_and_built(fake_engine, char_tokenizer):
    from ragen.rollout.registry import register_engine
    from ragen.trainer import builders

    cfg = _cfg("rollout.dtype=float32", "trainer.device=cpu", "trainer.seed=7")
    with pytest.raises(ConfigError) as info:  # another name is refused, listing the registered ones
        validate(replace(cfg, rollout=replace(cfg.rollout, engine="fake2")))
    assert "rollout.engine='fake2' is unknown; use one of ('hf', 'vllm', 'fake')" in info.value.problems
    fake = replace(cfg, rollout=replace(cfg.rollout, engine="fake"))
    validate(fake)  # accepted: the checks read the registry
    engine = builders.build_engine(fake, "/models/policy", char_tokenizer)
    assert isinstance(engine, FakeEngine)
    assert engine.kwargs == {"model": "/models/policy", "tokenizer": char_tokenizer, "device": "cpu",
                             "dtype": "float32", "seed": 7, "flavour": "plain"}
    # the unused engine's section is still refused by the inert rules, naming the selected engine
    tuned = replace(fake, rollout=replace(fake.rollout, vllm=replace(fake.rollout.vllm, max_num_seqs=64)))
    with pytest.raises(ConfigError, match=r"rollout.vllm.max_num_seqs=64 has no effect: rollout.engine='fake'"):
        validate(tuned)
    # the packages an entry names must be importable, with the entry's own message or a generic one
    register_engine(replace(fake_engine, packages=("ragen_no_such_package",)))
    with pytest.raises(ConfigError, match=r"rollout.engine=fake needs the package\(s\) ragen_no_such_package"):
        validate(fake)


def test_a_section_names_every_bad_value_at_once_from_its_one_rule_function():
    """A section's value rules are one function: the dataclass raises all its problems (a config built from the
    command line or in Python), and the registry lists the same function."""
    from ragen.trainer.config.compose import load_train_config
    from ragen.trainer.config.schema import TrainerSection, trainer_problems

    with pytest.raises(ConfigError) as info:
        load_train_config("base", ["trainer.max_restarts=-1", "trainer.placement_timeout_s=0"])
    text = str(info.value)
    assert "trainer.max_restarts must be >= 0" in text and "trainer.placement_timeout_s must be > 0 seconds" in text
    with pytest.raises(ValueError, match="trainer.max_restarts must be >= 0.*; trainer.placement_timeout_s"):
        TrainerSection(max_restarts=-1, placement_timeout_s=0)
    import ragen.trainer.config.shared_checks  # noqa: F401  (registers the section checks)

    values = SimpleNamespace(**{**asdict(TrainerSection()), "max_restarts": -2})  # as the dataclass would hold
    assert trainer_problems(values) == preflight.CHECKS["trainer_values"].fn(SimpleNamespace(trainer=values)) == [
        "trainer.max_restarts must be >= 0 (0 = a dead worker stops the run), got -2"]
