"""Rollout filtering is defined per episode in both layouts: the in-group reward std counts each episode once
(not once per turn row) and leaves out episodes that train nothing (failed ones), so the ``turn`` and
``trajectory`` layouts keep the same groups."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.trainer.credit import filter_groups_by_std


def _rollout(char_tok, fake_engine, layout: str):
    """3 groups of 3 episodes on a line walk (done after 2 valid steps, 4 turns at most): env i answers 'up'
    (invalid) on its first i turns, so episodes have 2, 3 or 4 turns and different rewards."""
    end = char_tok.convert_tokens_to_ids("<|end|>")
    say = {a: char_tok(f"<answer>{a}</answer>", add_special_tokens=False)["input_ids"] + [end] for a in ("up", "right")}

    def script(call, i, prompt):
        return say["up"] if call < i % 3 else say["right"]

    spec = [EnvGroupSpec("test_line", {"rewards": (1.0, 2.0), "horizon": 2}, n_groups=3, group_size=3)]
    cfg = AgentConfig(max_turn=4, think=False, max_new_tokens=64, layout=layout, format_penalty=-0.5)
    return AgentProxy(fake_engine(script), char_tok, cfg, spec, [], seed=3).rollout()


def _episode_rows(batch):
    first = {}
    for r, e in enumerate(batch.episode_index.tolist()):
        first.setdefault(e, r)
    return first


def test_filter_keeps_the_same_groups_in_both_layouts(char_tok, fake_engine):
    traj, turn = _rollout(char_tok, fake_engine, "trajectory"), _rollout(char_tok, fake_engine, "turn")
    assert sorted(set(turn.num_turns.tolist())) == [2, 3, 4] and turn.batch_size == 27
    # give the groups different spreads: group g's episodes get extra rewards g * (0, 1, 5)
    for batch in (traj, turn):
        for r, e in enumerate(batch.episode_index.tolist()):
            batch.turn_rewards[r, 0] += int(batch.group_ids[r]) * (0, 1, 5)[e % 3]
    k_traj, m_traj = filter_groups_by_std(traj, 0.3)
    k_turn, m_turn = filter_groups_by_std(turn, 0.3)
    assert set(k_traj.group_ids.tolist()) == set(k_turn.group_ids.tolist()) == {2}
    for key in ("rollout/group_reward_std_mean", "rollout/kept_group_reward_std_mean"):
        assert m_turn[key] == pytest.approx(m_traj[key], rel=1e-6), key
    # by hand: the population std of each group's 3 episode returns, averaged over the groups
    rows = _episode_rows(traj)
    returns = torch.tensor([float(traj.turn_rewards[rows[e]].sum()) for e in range(9)]).view(3, 3)
    assert m_turn["rollout/group_reward_std_mean"] == pytest.approx(float(returns.std(dim=1, unbiased=False).mean()))

def test_failed_episodes_do_not_count_in_the_std(char_tok, fake_engine):
    for layout in ("trajectory", "turn"):
        batch = _rollout(char_tok, fake_engine, layout)
        failed = batch.episode_index == 1  # episode 1 (group 0) failed: its partial reward is noise
        batch.failed = failed
        base = filter_groups_by_std(batch, 1.0)[1]["rollout/group_reward_std_mean"]
        batch.turn_rewards[failed] += 100.0
        noisy = dataclasses.replace(batch)
        assert filter_groups_by_std(noisy, 1.0)[1]["rollout/group_reward_std_mean"] == pytest.approx(base), layout
