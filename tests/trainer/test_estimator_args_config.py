"""``algorithm.estimator_args`` from the command line to the advantages: a plugin estimator's own keyword
hyperparameter is set as ``algorithm.estimator_args.<name>=value`` (no ``+``), bound to its signature before any
worker starts (unknown and missing names refused with the key) and passed to it when the step's credit is computed."""

import sys

import pytest
import torch

from ragen import plugins
from ragen.agent.batch import RolloutBatch
from ragen.launch import validate
from ragen.trainer.config.compose import load_train_config, open_mapping_overrides
from ragen.trainer.config.schema import ConfigError
from ragen.trainer.credit import step_credit
from ragen.trainer.layout import layout_of

PLUGIN = '''
"""GRPO's advantages times beta (required) plus shift (default 0): an estimator with hyperparameters of its own."""
from ragen.algorithms import ADVANTAGE_ESTIMATORS, register_estimator


def scaled_grpo(inputs, *, eps, norm_by_std, beta, shift=0.0):
    adv, ret = ADVANTAGE_ESTIMATORS["grpo"].fn(inputs, eps=eps, norm_by_std=norm_by_std)
    return beta * adv + shift, ret


register_estimator("{name}", scaled_grpo, needs=("group_ids",))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A plugin module on sys.path registering ``scaled_grpo_plugin``; the overrides that select it."""
    from ragen.algorithms import ADVANTAGE_ESTIMATORS

    (tmp_path / "scaled_plugin.py").write_text(PLUGIN.format(name="scaled_grpo_plugin"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set(plugins._loaded))
    estimators = dict(ADVANTAGE_ESTIMATORS)
    yield ["imports=[scaled_plugin]", "algorithm.estimator=scaled_grpo_plugin", "rollout.group_size=2",
           "algorithm.whiten=false", "algorithm.norm_by_std=false"]
    ADVANTAGE_ESTIMATORS.clear()
    ADVANTAGE_ESTIMATORS.update(estimators)
    sys.modules.pop("scaled_plugin", None)  # the next test's import registers it again


def _batch(rewards: list[float], group_size: int) -> RolloutBatch:
    """One-turn rows of 6 tokens, model tokens 2..4, the reward on token 4."""
    b, t = len(rewards), 6
    resp = torch.zeros(b, t, dtype=torch.long)
    resp[:, 2:5] = 1
    token_rewards = torch.zeros(b, t)
    token_rewards[:, 4] = torch.tensor(rewards)
    return RolloutBatch(
        input_ids=torch.arange(b * t).view(b, t), attention_mask=torch.ones(b, t, dtype=torch.long),
        response_mask=resp, turn_ids=torch.where(resp.bool(), 0, -1), token_rewards=token_rewards,
        sample_log_probs=torch.zeros(b, t), group_ids=torch.arange(b) // group_size,
        turn_rewards=torch.tensor(rewards).view(b, 1), num_turns=torch.ones(b, dtype=torch.long),
        truncated=torch.zeros(b, dtype=torch.bool))


def _credit(cfg) -> torch.Tensor:
    batch = _batch([1.0, 0.0, 3.0, 1.0], 2)
    adv, _, _ = step_credit(cfg.algorithm, layout_of(cfg).advantages, batch, None, None, torch.zeros(4, 6), None)
    return adv


@pytest.mark.parametrize("form", ["algorithm.estimator_args.beta=0.3", "+algorithm.estimator_args.beta=0.3",
                                  "algorithm.estimator_args={beta:0.3}"])
def test_a_plugin_estimator_receives_its_command_line_hyperparameter(plugin, form):
    cfg = load_train_config("base", [*plugin, form])
    assert cfg.algorithm.estimator_args == {"beta": 0.3}
    validate(cfg)
    # GRPO without the std: group 0 (1, 0) -> +-0.5, group 1 (3, 1) -> +-1, on each row's three model tokens
    want = torch.zeros(4, 6)
    want[:, 2:5] = 0.3 * torch.tensor([0.5, -0.5, 1.0, -1.0]).view(4, 1)
    torch.testing.assert_close(_credit(cfg), want)
    shifted = load_train_config("base", [*plugin, form, "algorithm.estimator_args.shift=2"])
    validate(shifted)
    torch.testing.assert_close(_credit(shifted), torch.where(want != 0, want + 2, 0.0))


def test_an_unknown_name_is_refused_with_the_closest(plugin):
    cfg = load_train_config("base", [*plugin, "algorithm.estimator_args.beta=0.3", "algorithm.estimator_args.sift=1"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert ("algorithm.estimator_args.sift=1: estimator 'scaled_grpo_plugin' takes no parameter 'sift'; did you "
            "mean algorithm.estimator_args.shift? (its own parameters: beta (required), shift=0.0; remove the key or "
            "pick the estimator that takes it)") in err.value.problems
    assert len(err.value.problems) == 1


def test_a_missing_required_parameter_is_refused(plugin):
    with pytest.raises(ConfigError) as err:
        validate(load_train_config("base", plugin))
    assert err.value.problems == [
        "algorithm.estimator_args.beta is required by estimator 'scaled_grpo_plugin' (its own parameters: beta "
        "(required), shift=0.0); set algorithm.estimator_args.beta=<value>"]


def test_a_builtin_estimator_refuses_an_argument_it_does_not_take():
    cfg = load_train_config("base", ["algorithm.estimator_args.beta=0.3"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.problems == [
        "algorithm.estimator_args.beta=0.3: estimator 'gae' takes no parameter 'beta'; (its own parameters: none; "
        "remove the key or pick the estimator that takes it)"]
    with pytest.raises(ConfigError, match="algorithm.estimator_args.gamma: gamma is a shared scalar, not an argument "
                                          "of estimator 'grpo'; set algorithm.gamma instead"):
        validate(load_train_config("base", ["algorithm=grpo", "algorithm.estimator_args.gamma=0.5"]))


def test_only_plain_overrides_of_the_open_mapping_become_adds():
    line = ["algorithm.estimator_args.beta=0.3", "algorithm.estimator_args={beta:1}", "+algorithm.estimator_args.a=1",
            "~algorithm.estimator_args.b", "algorithm.estimator=grpo", "--config-name", "algorithm.estimator_argsx=1"]
    assert open_mapping_overrides(line) == [
        "++algorithm.estimator_args.beta=0.3", "++algorithm.estimator_args={beta:1}", "+algorithm.estimator_args.a=1",
        "~algorithm.estimator_args.b", "algorithm.estimator=grpo", "--config-name", "algorithm.estimator_argsx=1"]


def test_the_command_refuses_it_before_anything_starts(tmp_path, capsys):
    """``ragen train`` (Hydra's own command line) with the plain form: the binding's message, exit status 2."""
    from ragen.cli import train

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        train.main(["model=tiny", f"trainer.output_dir={run}", "algorithm.estimator_args.beta=0.3", "--check"])
    assert exit_.value.code == 2
    assert "algorithm.estimator_args.beta=0.3: estimator 'gae' takes no parameter 'beta'" in capsys.readouterr().err
    assert not run.exists()
