"""Hand-computed checks of the ArCHer family's pure functions: targets, Polyak averaging, advantages,
Monte-Carlo returns, the filtered-BC cutoff and the BC loss on small inputs worked out by hand."""

import pytest
import torch

from ragen.algorithms import archer as A
from ragen.algorithms.losses import bc_loss


def test_q_target_bootstraps_unless_done():
    r, v = torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -2.0])
    y = A.q_targets(r, torch.tensor([0.0, 1.0]), v, gamma=0.95)
    assert torch.allclose(y, torch.tensor([-2.9, -1.0]))  # -1 + 0.95 * -2 ; done: -1
    assert A.v_targets(torch.tensor([0.7])).item() == pytest.approx(0.7)


def test_polyak_moves_toward_online():
    target, online = [torch.zeros(3)], [torch.ones(3)]
    A.polyak_update(target, online, tau=0.1)
    assert torch.allclose(target[0], torch.full((3,), 0.1))
    A.polyak_update(target, online, tau=0.1)
    assert torch.allclose(target[0], torch.full((3,), 0.19))
    with pytest.raises(ValueError, match="tau"):
        A.polyak_update(target, online, tau=1.5)


def test_advantage_is_min_q_minus_min_v():
    adv = A.advantage(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([0.2]), torch.tensor([0.4]))
    assert adv.item() == pytest.approx(0.3)


def test_monte_carlo_returns():
    assert A.monte_carlo_returns([-1.0, -1.0, 0.0], 0.95) == pytest.approx([-1.95, -1.0, 0.0])
    assert A.monte_carlo_returns([], 0.9) == []


def test_filtered_bc_cutoff_keeps_only_the_top():
    rewards = torch.arange(10, dtype=torch.float32)
    cut = A.filter_cutoff(rewards, 0.9)
    assert cut == pytest.approx(8.1)
    assert A.filtered_bc_keep(rewards, cut).nonzero().flatten().tolist() == [9]
    with pytest.raises(ValueError):
        A.filter_cutoff(torch.zeros(0), 0.9)


def test_filtered_bc_loss_is_the_bc_loss():
    lp = torch.log(torch.tensor([[0.5, 0.25, 1.0], [0.5, 0.5, 0.5]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = (torch.log(torch.tensor(2.0)) * 2 + torch.log(torch.tensor(4.0))) / 3
    assert A.filtered_bc_loss(lp, mask).item() == pytest.approx(expected.item(), rel=1e-6)
    assert A.filtered_bc_loss(lp, mask).item() == pytest.approx(bc_loss(lp, mask).item())


def test_reinforce_loss_hand_computed_and_gradient():
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([0.3, -1.0])
    loss = A.reinforce_loss(lp, adv, mask)
    # row 0: -0.3 * (-3) = 0.9 ; row 1: 1.0 * (-0.5) = -0.5 ; mean over 2 rows = 0.2
    assert loss.item() == pytest.approx(0.2)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.15, -0.15, 0.0], [0.5, 0.0, 0.0]]))
    # at ratio 1 the clipped variant has the same value; with a baseline b the advantage becomes A - b
    same = A.reinforce_loss(lp.detach(), adv, mask, old_log_probs=lp.detach(), clip=0.2)
    assert same.item() == pytest.approx(0.2)
    base = A.reinforce_loss(lp.detach(), adv, mask, token_baseline=torch.full((2, 3), 0.3))
    assert base.item() == pytest.approx((0.0 + 1.3 * -0.5) / 2)


def test_reinforce_clip_limits_the_ratio():
    lp = torch.tensor([[0.0]])
    old = torch.tensor([[-1.0]])  # ratio e = 2.718 > 1.2
    loss = A.reinforce_loss(lp, torch.tensor([1.0]), torch.ones(1, 1), old_log_probs=old, clip=0.2)
    assert loss.item() == pytest.approx(-1.2)


def test_chai_picks_the_highest_min_q_with_a_fake_critic():
    def fake_critic(states, actions):  # target min-Q = number of letters "y" in the action, per state offset
        pairs = zip(states, actions, strict=True)
        return torch.tensor([float(a.count("y")) + (0.0 if s == "s0" else 10.0) for s, a in pairs])

    picks = A.chai_select(["s0", "s1"], [["n", "yy", "y"], ["yyy", "y", "n"]], fake_critic)
    assert picks == [1, 0]
    assert A.chai_pick(torch.tensor([[0.1, 0.5, 0.5], [-1.0, -2.0, -0.5]])).tolist() == [1, 2]
