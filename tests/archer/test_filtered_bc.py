"""Online filtered BC in the ArCHer trainer (fake engine and actor): the reward bar is a quantile of the
trajectories whose turns it keeps (those in the replay buffer), and the loss aggregation is a config choice."""

from types import SimpleNamespace

import pytest
import torch
from archer_fakes import RecordingGroup, record, trainer_with_fakes

import ragen.archer.trainer as T
from ragen.algorithms import archer as A
from ragen.trainer.config.compose import load_train_config


def test_the_cutoff_is_a_quantile_of_the_buffers_trajectories(fake_engine, monkeypatch):
    """Iteration 1's trajectory (reward 0, 2 turns) leaves the 4-turn buffer in iteration 2, which holds the -4 and
    -3 trajectories: the bar is their 0.9 quantile, -3.1, and the -3 trajectory's 2 turns are imitated (a bar
    over every reward ever seen, 0 included, would be -0.6 and keep no turn of the buffer)."""
    rollouts = iter([
        ([record(0, 0, 0.0, [1], [2]), record(0, 1, 0.0, [1, 2, 3], [4])], [0.0]),
        ([record(1, 0, -4.0, [5], [6]), record(1, 1, -4.0, [5, 6, 7], [8]),
          record(2, 0, -3.0, [9], [10]), record(2, 1, -3.0, [9, 10, 11], [12])], [-4.0, -3.0]),
    ])
    monkeypatch.setattr(T, "transitions_from_batch", lambda *args, **kw: next(rollouts))
    actor = RecordingGroup(bc_update={"sft/loss": 1.0}, sft_update={"sft/loss": 1.0})
    trainer = trainer_with_fakes("filtered_bc_twenty_questions", fake_engine.fixed([1]),
                                 ["archer.capacity=4", "archer.warmup_iter=0", "archer.batch_size=8",
                                  "actor.mini_batch_size=8"], actor=actor, critic=None)
    trainer.run.proxy.rollout = lambda mode, responder=None: SimpleNamespace(metrics={})
    assert trainer.train_step()["bc/kept_turns"] == 2
    trainer.run.step += 1
    second = trainer.train_step()
    assert second["bc/cutoff"] == pytest.approx(-3.1) and second["bc/kept_turns"] == 2
    method, (batch,), kw = [c for c in actor.calls if c[0].endswith("_update")][-1]
    assert set(batch.input_ids[:, 0].tolist()) == {9}  # every imitated row is a turn of the -3 trajectory
    assert (method, kw) == ("bc_update", {"agg": "token-mean", "loss_scale": 1.0})


def test_trajectory_rewards_count_each_trajectory_once():
    episodes, rewards = torch.tensor([3, 3, 3, 7, 5, 5]), torch.tensor([-3.0, -3.0, -3.0, 0.0, -2.0, -2.0])
    assert A.trajectory_rewards(episodes, rewards).tolist() == [-3.0, 0.0, -2.0]
    assert A.filter_cutoff(A.trajectory_rewards(episodes, rewards), 0.5) == pytest.approx(-2.0)


def test_bc_loss_aggregation_token_mean_or_the_references_utterance_sum():
    lp = torch.log(torch.tensor([[0.5, 0.25, 1.0], [0.5, 0.5, 0.5]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    ln2 = torch.log(torch.tensor(2.0)).item()
    # NLLs: row 0 ln2 + ln4 = 3 ln2, row 1 ln2; 3 tokens, 2 utterances
    assert A.filtered_bc_loss(lp, mask, agg="token-mean").item() == pytest.approx(4 * ln2 / 3, rel=1e-6)
    assert A.filtered_bc_loss(lp, mask, agg="utterance-sum").item() == pytest.approx(4 * ln2 / 2, rel=1e-6)
    with pytest.raises(ValueError, match="seq-mean"):
        A.filtered_bc_loss(lp, mask, agg="seq-mean")
    with pytest.raises(ValueError, match="archer.bc_loss_agg='sum'"):
        load_train_config("filtered_bc_twenty_questions", ["archer.bc_loss_agg=sum"])
