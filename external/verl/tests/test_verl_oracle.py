"""verl 0.9.1's ``core_algos`` as an oracle for ragen's estimators, on random multi-turn inputs (several seeds).

Inputs are verl's response window, shape (B, T): ``response_mask`` 1 on model tokens with env-observation spans
(0) between turns and right padding (0); rewards only on model tokens (ragen's ``token_rewards`` are nonzero only
there; verl's GRPO/RLOO sum ``token_level_rewards`` over all positions, so rewards off the mask would count there
and not in ragen: a convention, not exercised). float64 throughout. The mappings tested, per estimator:

* ``gae`` (ragen ``skip_env_tokens=True``) vs ``compute_gae_advantage_return``: verl also skips masked positions
  (their values and TD errors are carried over), so the raw advantages agree; verl then whitens them and ragen
  whitens separately. Mapping: ``verl_adv = W(ragen_adv)`` on the mask, with verl's whitening
  ``W(x) = (x - mu) / sqrt(var_u + 1e-8)``, ``mu = sum_m x / (N + 1e-8)``, ``var_u`` the masked variance computed
  the same way times N / (N - 1) (ragen's ``masked_whiten`` instead defaults to the population variance and
  ``(x - mu) / (std + eps)``); ``verl_ret = ragen_ret`` on the mask (verl's returns off the mask are A + V of
  carried values, not used by its losses).
* ``grpo`` vs ``compute_grpo_outcome_advantage`` (unbiased std, eps outside the sqrt in both; with and without
  std): equal everywhere for groups of >= 2 rows. Singleton groups differ (see ``test_singleton_groups_differ``).
* ``rloo`` vs ``compute_rloo_outcome_advantage``: equal everywhere for groups of >= 2 rows; singletons differ.
* ``reinforce_pp`` vs ``compute_reinforce_plus_plus_outcome_advantage`` (both skip env tokens in the discounted
  return): ``verl_ret = ragen_ret`` everywhere, ``verl_adv = W(ragen_ret)`` on the mask and 0 off it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragen.algorithms.gae import gae
from ragen.algorithms.group import grpo, reinforce_pp, rloo

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos",
    reason="verl 0.9.1 is not importable: install it with `bash scripts/setup_verl.sh` (external/verl/README.md)",
    exc_type=ImportError,
)
SEEDS = [0, 1, 2, 3, 4]
F64 = torch.float64


def random_rows(seed: int, B: int = 12, T: int = 40) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask, rewards, values): 1-4 turns of 1-6 model tokens, 0-5 env tokens between turns, right padding.
    Each turn's last model token gets a reward (binary for even rows: ties make constant groups), values random
    everywhere (also on env tokens: they must not matter)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.long)
    rewards = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        t = 0
        for k in range(int(torch.randint(1, 5, (1,), generator=g))):
            if k:
                t += int(torch.randint(0, 6, (1,), generator=g))
            n = int(torch.randint(1, 7, (1,), generator=g))
            if t + n > T:
                break
            mask[b, t : t + n] = 1
            r = torch.randint(0, 2, (1,), generator=g).to(F64) if b % 2 == 0 else torch.randn(1, generator=g, dtype=F64)
            rewards[b, t + n - 1] = r
            t += n
    values = torch.randn(B, T, generator=g, dtype=F64)
    return mask, rewards, values


def verl_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The whitening verl applies (``verl.utils.torch_functional.masked_whiten``), written out as the mapping.

    With verl's integer response mask, its count ``N + 1e-8`` and Bessel factor ``N / (N - 1)`` are float32
    scalars (int tensor + python float, int / int), so they are formed the same way here; the rest is float64.
    """
    n = mask.sum()  # int64, as in verl
    m = mask.to(F64)
    mu = (x * m).sum() / (n + 1e-8)
    var = ((x - mu) ** 2 * m).sum() / (n + 1e-8) * (n / (n - 1))
    return (x - mu) * torch.rsqrt(var + 1e-8)


def groups(seed: int, B: int) -> torch.Tensor:
    """Random group ids, every group of >= 2 rows (sizes 2-4)."""
    g = torch.Generator().manual_seed(1000 + seed)
    ids, gid = [], 0
    while len(ids) < B:
        size = min(int(torch.randint(2, 5, (1,), generator=g)), B - len(ids))
        if size == 1:  # fold a leftover row into the previous group
            ids.append(gid - 1)
            continue
        ids += [gid] * size
        gid += 1
    return torch.tensor(ids)[torch.randperm(B, generator=g)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3)])
def test_gae_matches_verl(seed, gamma, lam):
    mask, rewards, values = random_rows(seed)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam, skip_env_tokens=True)
    v_adv, v_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    m = mask.bool()
    assert (mask[:, :-1] - mask[:, 1:] == -1).sum() > mask.shape[0] // 2  # env spans between turns exist
    torch.testing.assert_close(v_ret[m], ret[m], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v_adv[m], verl_whiten(adv, mask)[m], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_verl(seed, norm_by_std):
    mask, rewards, _ = random_rows(seed)
    gid = groups(seed, mask.shape[0])
    adv, _ = grpo(rewards, mask, gid, eps=1e-6, norm_by_std=norm_by_std)
    v_adv, _ = core_algos.compute_grpo_outcome_advantage(
        rewards, mask, gid.numpy(), epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std)
    torch.testing.assert_close(v_adv, adv, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_matches_verl(seed):
    mask, rewards, _ = random_rows(seed)
    gid = groups(seed, mask.shape[0])
    adv, _ = rloo(rewards, mask, gid)
    v_adv, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, gid.numpy())
    torch.testing.assert_close(v_adv, adv, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_verl(seed, gamma):
    from verl.trainer.config import AlgoConfig

    mask, rewards, _ = random_rows(seed)
    _, ret = reinforce_pp(rewards, mask, gamma=gamma)
    config = AlgoConfig(gamma=gamma)
    v_adv, v_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=config)
    torch.testing.assert_close(v_ret, ret, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v_adv, verl_whiten(ret, mask) * mask, rtol=1e-12, atol=1e-12)


def test_singleton_groups_differ():
    """The one real difference: a trajectory alone in its group. ragen gives it advantage 0 (no baseline to
    compare with, docs/estimators.md); verl's GRPO uses mean 0 / std 1, i.e. R / (1 + eps), and its RLOO the raw R."""
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1], [1, 0, 1, 1]])
    rewards = torch.tensor([[0, 0, 0, 2.0], [0, 0, 0, 1.0], [0, 0, 0, 3.0]], dtype=F64)
    gid = torch.tensor([0, 1, 1])
    adv, _ = grpo(rewards, mask, gid, eps=1e-6)
    v_adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, np.array([0, 1, 1]), epsilon=1e-6)
    assert adv[0].tolist() == [0.0] * 4
    denom = torch.tensor(1.0) + 1e-6  # verl's std 1 of a singleton: a float32 tensor, + eps in float32
    torch.testing.assert_close(v_adv[0], 2.0 / denom * mask[0].to(F64), rtol=1e-12, atol=0)
    torch.testing.assert_close(v_adv[1:], adv[1:], rtol=1e-12, atol=1e-12)  # the pair agrees: -/+ 1/sqrt(2)
    r_adv, _ = rloo(rewards, mask, gid)
    vr_adv, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, np.array([0, 1, 1]))
    assert r_adv[0].tolist() == [0.0] * 4 and vr_adv[0].tolist() == [2.0, 2.0, 0.0, 2.0]
    torch.testing.assert_close(vr_adv[1:], r_adv[1:], rtol=1e-12, atol=1e-12)  # +/- 2 = n/(n-1) * (R - mean)
