"""Your own env and estimator without editing ragen (``ragen.plugins``): the ``imports`` key, entry points of an
installed package, the env's own defaults as its config, and clear errors naming the module and the fix."""

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from trainer_helpers import read_metrics, tiny_overrides

from ragen import plugins
from ragen.launch import validate
from ragen.trainer.config.compose import load_train_config, prepare_from_argv, to_train_config
from ragen.trainer.config.schema import ConfigError, EnvSection

ROOT = Path(__file__).resolve().parents[2]
MARKER = "GUESS_PLUGIN_MARKER"  # the plugin appends "<event> <pid>" lines to this file (import, estimator calls)

ENV_SOURCE = '''
"""Guess a number from 1 to n; the observation says higher or lower; reward 1 on the right guess."""
import os
import random

from ragen.env import StepResult


def _mark(event):
    if os.environ.get("{marker}"):
        with open(os.environ["{marker}"], "a") as fh:
            fh.write(f"{{event}} {{os.getpid()}}\\n")


_mark("import")


class GuessNumber:
    DEFAULT_MAX_TURN = 4
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    def __init__(self, n: int = 8, hint: bool = True):
        if n < 2:
            raise ValueError(f"n must be >= 2, got {{n}}")
        self.n, self.hint = n, hint
        self.instructions = f"Guess the secret integer from 1 to {{n}}. Answer with one integer."
        self.secret = None

    def reset(self, seed):
        self.secret, self.lo, self.hi = random.Random(seed).randint(1, self.n), 1, self.n
        return f"Guess a number from 1 to {{self.n}}."

    def legal_actions(self):
        return f"an integer from {{self.lo}} to {{self.hi}}"

    def action_list(self):
        return [str(k) for k in range(self.lo, self.hi + 1)]

    def expert_action(self):
        if self.secret is None:
            raise RuntimeError("call reset() first")
        return str((self.lo + self.hi) // 2)

    def step(self, action):
        if self.secret is None:
            raise RuntimeError("call reset() first")
        try:
            guess = int(action.strip())
        except ValueError:
            return StepResult("Not an integer.", 0.0, False, {{"action_is_valid": False}})
        if guess == self.secret:
            return StepResult("Right!", 1.0, True, {{"action_is_valid": True, "action_is_effective": True,
                                                    "success": True}})
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
        else:
            self.hi = min(self.hi, guess - 1)
        word = "higher" if guess < self.secret else "lower"
        return StepResult(f"{{guess}} is wrong; the secret is {{word}}.", 0.0, False,
                          {{"action_is_valid": True, "action_is_effective": True}})
'''

ESTIMATOR_SOURCE = '''
"""grpo's advantages times 1, registered under a new name."""
from ragen.algorithms import ADVANTAGE_ESTIMATORS, register_estimator

from {package}.env import _mark


def grpo_times_one(inputs, *, eps, norm_by_std):
    _mark("estimator")
    adv, ret = ADVANTAGE_ESTIMATORS["grpo"].fn(inputs, eps=eps, norm_by_std=norm_by_std)
    return adv * 1.0, ret


register_estimator("{name}", grpo_times_one, needs=("group_ids",))
'''


@pytest.fixture(autouse=True)
def restore_registries(monkeypatch):
    """Envs and estimators these tests register leave the registries when the test ends (other tests list them)."""
    from ragen.algorithms import ADVANTAGE_ESTIMATORS
    from ragen.env import base

    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(plugins, "_loaded", set(plugins._loaded))
    estimators = dict(ADVANTAGE_ESTIMATORS)
    yield
    ADVANTAGE_ESTIMATORS.clear()
    ADVANTAGE_ESTIMATORS.update(estimators)


def write_plugin(root: Path, package: str, estimator: str, register_env: str | None = None) -> Path:
    """A plugin package ``root/package`` (env.py: GuessNumber, registered as ``register_env`` when given;
    estimator.py: ``estimator`` = grpo x 1); returns ``root``."""
    pkg = root / package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    env = ENV_SOURCE.format(marker=MARKER)
    if register_env:
        env += f"\n\nfrom ragen.env import register\nregister({register_env!r})(GuessNumber)\n"
    (pkg / "env.py").write_text(env)
    (pkg / "estimator.py").write_text(ESTIMATOR_SOURCE.format(package=package, name=estimator))
    return root


def test_imports_key_registers_env_and_estimator(tmp_path, monkeypatch):
    """imports=[module] (no entry points): env=<its env> gets the env's own defaults (DEFAULT_MAX_TURN 4, the
    constructor's n=8, hint=true; not ppo_multi_turn's 3-turn FrozenLake), algorithm.estimator=<its estimator>
    validates, and the estimator returns grpo's advantages."""
    monkeypatch.syspath_prepend(str(write_plugin(tmp_path, "guess_a", "grpo_times_one_a", register_env="guess_a")))
    overrides = ["imports=[guess_a.env,guess_a.estimator]", "env=guess_a", "algorithm.estimator=grpo_times_one_a",
                 "rollout.group_size=2"]
    cfg = load_train_config("ppo_multi_turn", overrides)
    assert cfg.imports == ["guess_a.env", "guess_a.estimator"]
    assert cfg.env == EnvSection(name="guess_a", max_turn=4, max_actions_per_turn=1, config={"n": 8, "hint": True})
    validate(cfg)  # the CPU recipe's warm start uses the env's expert
    assert load_train_config("ppo_multi_turn", [*overrides, "env.config.n=5"]).env.config == {"n": 5, "hint": True}

    from ragen.algorithms import AdvantageInputs, compute_advantage

    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0]])
    inputs = AdvantageInputs(token_rewards=torch.tensor([[0, 1.0, 0], [0, 0, 0], [3.0, 0, 0], [1.0, 0, 0]]),
                             response_mask=mask, turn_ids=torch.where(mask.bool(), 0, -1),
                             group_ids=torch.tensor([0, 0, 1, 1]))
    adv, _ = compute_advantage("grpo_times_one_a", inputs, norm_by_std=False)
    # group 0: returns 1, 0 (mean 0.5); group 1: 3, 1 (mean 2): advantages +-0.5 and +-1 on each row's tokens
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0], [-0.5, -0.5, 0], [1.0, 0, 0], [-1.0, 0, 0]]))


def test_eval_takes_a_plugin_env(tmp_path, monkeypatch):
    """python -m ragen.eval --env <plugin env> with imports=[...] among its overrides."""
    from ragen.evaluation.runner import env_config

    monkeypatch.syspath_prepend(str(write_plugin(tmp_path, "guess_e", "grpo_times_one_e", register_env="guess_e")))
    cfg = env_config("ppo_multi_turn", ["imports=[guess_e.env]"], "guess_e")
    assert (cfg.env.name, cfg.env.max_turn) == ("guess_e", 4)
    with pytest.raises(ConfigError, match="cannot import 'guess_f.env'"):
        env_config("ppo_multi_turn", ["imports=[guess_f.env]"], "guess_f")


def test_imports_in_the_primary_config_and_its_config_dir(tmp_path, monkeypatch):
    """An experiment of the user's own (--config-dir) names its plugin in `imports:`; the entry point's preparation
    imports it before Hydra composes, so `env=<plugin env>` resolves."""
    monkeypatch.syspath_prepend(str(write_plugin(tmp_path / "src", "guess_b", "grpo_times_one_b",
                                                 register_env="guess_b")))
    (tmp_path / "my_exp.yaml").write_text("defaults:\n  - ppo_multi_turn\n  - _self_\nimports: [guess_b.env]\n")
    argv = ["--config-dir", str(tmp_path), "--config-name", "my_exp", "env=guess_b"]
    assert prepare_from_argv("base", argv) == ["guess_b.env"]
    from hydra.core.config_store import ConfigStore

    node = ConfigStore.instance().load("env/guess_b.yaml").node
    assert (node.name, node.max_turn, dict(node.config)) == ("guess_b", 4, {"n": 8, "hint": True})
    assert prepare_from_argv("base", [*argv, "imports=[]"]) == []  # the command line wins over the file


def test_failed_import_names_the_module_and_the_fix(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(plugins.PluginError, match=r"cannot import 'no_such_plugin_mod' \(ModuleNotFoundError.*"
                                                  r"PYTHONPATH"):
        load_train_config("ppo_multi_turn", ["imports=[no_such_plugin_mod]"])
    with pytest.raises(plugins.PluginError, match=r"'broken_plugin' \(RuntimeError: boom at import\)"):
        load_train_config("ppo_multi_turn", ["imports=broken_plugin"])
    with pytest.raises(ConfigError, match=r"imports=\[3\] must be a list of module names"):
        to_train_config({"imports": [3]})


def test_failed_import_on_the_command_line_exits_2(tmp_path, subprocess_env):
    proc = subprocess.run([sys.executable, "-m", "ragen.train", "--config-name", "ppo_multi_turn",
                           "imports=[no_such_plugin_mod]"], cwd=tmp_path, env=subprocess_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot import 'no_such_plugin_mod'" in proc.stderr and "Traceback" not in proc.stderr


def test_entry_points_register_by_name_and_name_the_broken_package(tmp_path, monkeypatch):
    """An entry point whose value is the env class registers it under the entry point's name; one whose value is a
    module registers what the module registers; a broken one names its group, value and package."""
    monkeypatch.syspath_prepend(str(write_plugin(tmp_path, "guess_c", "grpo_times_one_c")))
    eps = {plugins.ENV_GROUP: [importlib.metadata.EntryPoint("guess_c", "guess_c.env:GuessNumber",
                                                             plugins.ENV_GROUP)],
           plugins.ESTIMATOR_GROUP: [importlib.metadata.EntryPoint("grpo_times_one_c", "guess_c.estimator",
                                                                   plugins.ESTIMATOR_GROUP)]}
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps.get(group, []))
    cfg = load_train_config("ppo_bandit", ["env=guess_c", "algorithm.estimator=grpo_times_one_c"])
    assert (cfg.env.name, cfg.env.max_turn, cfg.algorithm.estimator) == ("guess_c", 4, "grpo_times_one_c")
    assert plugins.load_plugins() == []  # idempotent: nothing new the second time
    eps[plugins.ENV_GROUP] = [importlib.metadata.EntryPoint("bad", "guess_c.nothing_here:X", plugins.ENV_GROUP)]
    with pytest.raises(plugins.PluginError, match=r"entry point bad = guess_c.nothing_here:X \(group ragen.envs\)"
                                                  r" failed to load \(ModuleNotFoundError"):
        plugins.load_plugins()


def test_env_defaults_from_the_constructor(monkeypatch):
    """A required constructor argument is required in the config (??? -> an error naming env.config.<key>); a
    default that is not plain data names the argument."""
    import ragen.env
    from ragen.env import base

    class NeedsPath:
        DEFAULT_MAX_TURN = 2

        def __init__(self, path: str, sizes: tuple = (3, 4)):
            pass

    class Unplain:
        def __init__(self, rng: object = object()):
            pass

    monkeypatch.setitem(base._REGISTRY, "needs_path_env", NeedsPath)
    assert ragen.env.default_config("needs_path_env") == {
        "name": "needs_path_env", "max_turn": 2, "max_actions_per_turn": 1, "config": {"path": "???", "sizes": [3, 4]}}
    with pytest.raises(ConfigError, match=r"env.config.path is required"):
        load_train_config("ppo_bandit", ["env=needs_path_env"])
    monkeypatch.setitem(base._REGISTRY, "unplain_env", Unplain)
    with pytest.raises(ValueError, match=r"env 'unplain_env': the default of rng=<object"):
        ragen.env.default_config("unplain_env")
    with pytest.raises(plugins.PluginError, match=r"rng=<object.*ship config/env/<name>.yaml"):
        plugins.load_plugins()


def _install(tmp_path: Path) -> Path:
    """The plugin as an installed distribution with entry points, in a --target folder (no network, no deps)."""
    src = write_plugin(tmp_path / "pkg", "guess_plugin", "grpo_times_one")
    (src / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "guess-number-plugin"
        version = "0.1.0"

        [project.entry-points."ragen.envs"]
        guess_number = "guess_plugin.env:GuessNumber"

        [project.entry-points."ragen.estimators"]
        grpo_times_one = "guess_plugin.estimator"

        [tool.setuptools]
        packages = ["guess_plugin"]
    '''))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(src)], check=True, capture_output=True, timeout=300)
    return site


@pytest.mark.slow
def test_installed_plugin_trains_one_step_in_process_and_with_ray(tmp_path, subprocess_env):
    """bash train_ppo_multi_turn.sh env=guess_number algorithm.estimator=grpo_times_one with the plugin installed
    in a --target folder on PYTHONPATH: one step trains in-process and with Ray workers; the env keeps its own 4
    turns; the estimator ran in the driver; with Ray the workers (other processes) imported the plugin too."""
    site = _install(tmp_path)
    for use_ray in (False, True):
        run_dir, marker = tmp_path / f"run_{use_ray}", tmp_path / f"marker_{use_ray}"
        env = {**subprocess_env, MARKER: str(marker),
               "PYTHONPATH": os.pathsep.join([str(site), subprocess_env.get("PYTHONPATH", "")])}
        cmd = ["bash", str(ROOT / "train_ppo_multi_turn.sh"), "env=guess_number", "algorithm.estimator=grpo_times_one",
               *tiny_overrides(run_dir, steps=1), "trainer.val_before_train=false", "trainer.report=false",
               f"trainer.use_ray={str(use_ray).lower()}"]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        config = json.loads((run_dir / "config.json").read_text())
        assert config["env"] == {"name": "guess_number", "max_turn": 4, "max_actions_per_turn": 1,
                                 "config": {"n": 8, "hint": True}}
        assert config["algorithm"]["estimator"] == "grpo_times_one"
        assert "env/guess_number/success" in read_metrics(run_dir)[-1]
        events = [line.split() for line in marker.read_text().splitlines()]
        importers = {int(pid) for event, pid in events if event == "import"}
        callers = {int(pid) for event, pid in events if event == "estimator"}
        assert len(callers) == 1 and callers <= importers  # the driver computes the advantages
        if use_ray:  # the driver and the Ray worker processes
            assert len(importers) >= 2, events
        else:
            assert importers == callers, events
