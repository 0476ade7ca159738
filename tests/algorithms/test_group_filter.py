"""Reward-variance share group filtering (ragen.algorithms.group_filter): the selection on a hand example, ties,
invariance to group order, zero-variance batches and the refusal of one-episode groups."""

from __future__ import annotations

import pytest
import torch

from ragen.algorithms.group_filter import group_reward_variances, select_by_variance_share, variance_share_filter

# Five groups' variances (binary-exact, so the boundaries are exact):
#   group:     0     1     2     3     4
#   variance: 0.75  2.00  0.00  1.00  0.25      total 4.0
# Descending order: 1 (2.0), 3 (1.0), 0 (0.75), 4 (0.25), 2 (0.0); running sums 2.0, 3.0, 3.75, 4.0, 4.0.
#   share 0.5: target 2.0 -> the first sum >= 2.0 is group 1's:  kept {1},          variance share 2/4 = 0.5,
#              threshold 2.0, group share 1/5
#   share 0.9: target 3.6 -> reached at group 0 (3.75):          kept {0, 1, 3},    variance share 3.75/4 = 0.9375,
#              threshold 0.75, group share 3/5
#   share 1.0: target 4.0 -> reached at group 4 (4.0):           kept {0, 1, 3, 4}, variance share 1.0,
#              threshold 0.25, group share 4/5 (group 2 has no variance: never kept)
VARIANCES = torch.tensor([0.75, 2.0, 0.0, 1.0, 0.25])
EXPECTED = {0.5: ([1], 0.5, 2.0), 0.9: ([0, 1, 3], 0.9375, 0.75), 1.0: ([0, 1, 3, 4], 1.0, 0.25)}


@pytest.mark.parametrize("share", sorted(EXPECTED))
def test_hand_example(share):
    kept, var_share, threshold = EXPECTED[share]
    sel = select_by_variance_share(VARIANCES, share)
    assert sel.kept.tolist() == kept
    assert sel.kept_variance_share == pytest.approx(var_share)
    assert sel.threshold == pytest.approx(threshold)
    assert sel.kept_group_share == pytest.approx(len(kept) / 5)
    assert sel.total_variance == pytest.approx(4.0)
    assert sel.as_metrics()["rollout/snr_filter/kept_groups"] == len(kept)


def test_ties_broken_by_group_position():
    # three equal variances, share 0.5: target 1.5 of 3.0 -> two groups, the first two positions
    assert select_by_variance_share(torch.ones(3), 0.5).kept.tolist() == [0, 1]
    assert select_by_variance_share(torch.ones(3), 0.3).kept.tolist() == [0]


def test_invariant_to_group_order():
    gen = torch.Generator().manual_seed(0)
    variances = torch.rand(9, generator=gen, dtype=torch.float64)
    for share in (0.3, 0.6, 0.9, 1.0):
        base = select_by_variance_share(variances, share)
        perm = torch.randperm(9, generator=gen)
        moved = select_by_variance_share(variances[perm], share)
        assert sorted(perm[moved.kept].tolist()) == base.kept.tolist()
        assert moved.kept_variance_share == pytest.approx(base.kept_variance_share)
        assert moved.threshold == base.threshold


def test_all_zero_variance_keeps_nothing():
    sel = select_by_variance_share(torch.zeros(4), 0.9)
    assert sel.kept.tolist() == [] and sel.kept_group_share == 0.0 and sel.kept_variance_share == 0.0
    assert sel.threshold == 0.0 and sel.total_variance == 0.0


def test_rewards_with_group_ids():
    # episodes (group id: rewards): 7: (0, 1) var 0.25; 3: (0, 2) var 1.0; 5: (1, 1) var 0; 9: (0, 0, 3) var 2.0
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 0.0, 1.0, 3.0, 0.0])
    gids = torch.tensor([7, 3, 5, 7, 3, 9, 5, 9, 9])
    ids, var = group_reward_variances(rewards, gids)
    assert ids.tolist() == [3, 5, 7, 9]
    torch.testing.assert_close(var, torch.tensor([1.0, 0.0, 0.25, 2.0], dtype=torch.float64))
    # total 3.25; share 0.9 -> target 2.925: 2.0 (group 9) + 1.0 (group 3) = 3.0 >= 2.925 -> groups 3 and 9
    out = variance_share_filter(rewards, gids, 0.9)
    assert out.kept_group_ids.tolist() == [3, 9]
    assert out.keep.tolist() == [False, True, False, False, True, True, False, True, True]


def test_refusals():
    with pytest.raises(ValueError, match=r"group size must be > 1 \(set rollout.group_size > 1"):
        variance_share_filter(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), 0.9)
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="keep_variance_share"):
            select_by_variance_share(VARIANCES, share)
    with pytest.raises(ValueError, match=">= 0"):
        select_by_variance_share(torch.tensor([1.0, -0.5]), 0.5)
