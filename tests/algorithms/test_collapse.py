"""Template-collapse metrics (ragen.algorithms.collapse): a hand-computed 3-prompt example, the invariances and bounds
of the in-batch estimator, and positive / negative controls with scripted policies (an explicit conditional table
p(response | prompt) over distinct prompts): copying the observation gives MI ~ log N and retrieval ~ 1, ignoring it
gives MI ~ 0 and retrieval at chance."""

from __future__ import annotations

import math

import pytest
import torch

from ragen.algorithms.collapse import (
    TurnPair,
    collapse_metrics,
    collapse_metrics_by_turn,
    distinct_prompts,
    pick_pairs,
    pointwise_mi,
    retrieval_credit,
    turn_pairs,
)

# The worked example (also docs/collapse.md). Column j holds p(response_j | prompt_i) for i = 0, 1, 2:
#            r0     r1    r2
#   x0      0.50   0.10  0.40
#   x1      0.25   0.60  0.10
#   x2      0.25   0.20  0.10
# cross = log of it. Pointwise MI_j = log(p(r_j | x_j) / mean_i p(r_j | x_i)):
#   r0: mean (0.5 + 0.25 + 0.25) / 3 = 1/3, MI_0 = log(0.5 / (1/3)) = log 1.5 =  0.405465
#   r1: mean (0.1 + 0.6 + 0.2) / 3 = 0.3,   MI_1 = log(0.6 / 0.3)   = log 2   =  0.693147
#   r2: mean (0.4 + 0.1 + 0.1) / 3 = 0.2,   MI_2 = log(0.1 / 0.2)   = -log 2  = -0.693147
#   mi = (log 1.5 + log 2 - log 2) / 3 = log(1.5) / 3 = 0.135155
# Retrieval: r0's own prompt x0 scores highest (0.5), r1's x1 (0.6), but r2 scores highest under x0 (0.4 > 0.1):
#   retrieval_acc = 2/3; chance 1/3; bound log 3 = 1.098612.
TABLE = [[0.50, 0.10, 0.40], [0.25, 0.60, 0.10], [0.25, 0.20, 0.10]]
CROSS = torch.tensor(TABLE, dtype=torch.float64).log()


def test_hand_example():
    torch.testing.assert_close(pointwise_mi(CROSS), torch.tensor([math.log(1.5), math.log(2), -math.log(2)],
                                                                 dtype=torch.float64))
    m = collapse_metrics(CROSS)
    assert m.mi == pytest.approx(0.135155, abs=1e-6)
    assert m.retrieval_acc == pytest.approx(2 / 3)
    assert (m.chance_acc, m.mi_bound, m.n_responses) == (pytest.approx(1 / 3), pytest.approx(math.log(3)), 3)
    assert m.mi_per_token is None
    assert m.as_metrics()["collapse/mi"] == m.mi


def test_hand_example_per_token():
    # Lengths (2, 1, 4): the estimator on per-token scores cross[:, j] / len_j, i.e. on p^(1/len):
    #   r0: sqrt(0.5) = 0.707107, sqrt(0.25) = 0.5 twice; mean 0.569036; MI = log(0.707107 / 0.569036) =  0.217239
    #   r1: length 1, unchanged:                                            MI = log 2                   =  0.693147
    #   r2: 0.4^(1/4) = 0.795271, 0.1^(1/4) = 0.562341 twice; mean 0.639985; MI = log(0.562341 / 0.639985) = -0.129335
    #   mi_per_token = (0.217239 + 0.693147 - 0.129335) / 3 = 0.260350
    m = collapse_metrics(CROSS, response_lengths=torch.tensor([2, 1, 4]))
    assert m.mi_per_token == pytest.approx(0.260350, abs=1e-6)
    assert m.mi == pytest.approx(0.135155, abs=1e-6)  # the sequence estimate is unchanged by lengths


def test_ties_split_the_credit():
    # Column 0: x0 and x1 tie at the top -> 1/2; column 1: x1 alone on top -> 1; column 2: x0 above x2 -> 0.
    cross = torch.tensor([[-1.0, -3.0, -1.0], [-1.0, -1.0, -2.0], [-2.0, -3.0, -2.0]])
    torch.testing.assert_close(retrieval_credit(cross), torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64))


def test_column_shift_and_joint_permutation_invariance():
    gen = torch.Generator().manual_seed(0)
    cross = torch.randn(6, 6, generator=gen, dtype=torch.float64) * 3
    base = collapse_metrics(cross)
    shifted = cross + torch.randn(1, 6, generator=gen, dtype=torch.float64) * 50  # a constant per column
    torch.testing.assert_close(pointwise_mi(shifted), pointwise_mi(cross))
    assert collapse_metrics(shifted).retrieval_acc == base.retrieval_acc
    perm = torch.randperm(6, generator=gen)
    permuted = cross[perm][:, perm]  # relabel prompts and responses together
    torch.testing.assert_close(pointwise_mi(permuted), pointwise_mi(cross)[perm])
    assert collapse_metrics(permuted).retrieval_acc == pytest.approx(base.retrieval_acc)
    assert collapse_metrics(permuted).mi == pytest.approx(base.mi)


def test_bounds():
    """Each column's pointwise MI is at most log N (equality when the other prompts give the response probability 0),
    is >= 0 when the own prompt scores highest, and can be negative otherwise (so the mean can be too)."""
    gen = torch.Generator().manual_seed(1)
    for N in (2, 5, 9):
        cross = torch.randn(N, N, generator=gen, dtype=torch.float64) * 4
        mi, hit = pointwise_mi(cross), retrieval_credit(cross)
        assert bool((mi <= math.log(N) + 1e-12).all())
        assert bool((mi[hit == 1] >= 0).all())
    diagonal_only = torch.full((4, 4), -math.inf, dtype=torch.float64).fill_diagonal_(-2.0)
    torch.testing.assert_close(pointwise_mi(diagonal_only), torch.full((4,), math.log(4), dtype=torch.float64))
    anti = torch.tensor([[-5.0, 0.0], [0.0, -5.0]])  # each response far likelier under the other prompt
    assert collapse_metrics(anti).mi < -0.6 and collapse_metrics(anti).retrieval_acc == 0.0


def scripted_cross(table: torch.Tensor, obs: list[int], length: int, seed: int) -> torch.Tensor:
    """Sample one ``length``-token response per prompt from the per-token policy ``table[x]`` (a distribution over the
    vocab given observation x, tokens independent) and return the exact cross matrix
    cross[i, j] = sum_t log table[obs_i, z_jt]."""
    gen = torch.Generator().manual_seed(seed)
    responses = [torch.multinomial(table[x], length, replacement=True, generator=gen) for x in obs]
    logt = table.double().log()
    return torch.stack([torch.stack([logt[x, z].sum() for z in responses]) for x in obs])


@pytest.mark.parametrize("N", [4, 16])
def test_copying_policy_reads_its_prompt(N):
    """Positive control: the response repeats the observation token with probability 0.9 per token (the rest spread
    over the vocab of N tokens). Distinct prompts: MI close to log N, retrieval close to 1."""
    eps = 0.1
    table = torch.full((N, N), eps / (N - 1)).fill_diagonal_(1 - eps)
    m = collapse_metrics(scripted_cross(table, list(range(N)), length=4, seed=0))
    assert m.mi == pytest.approx(math.log(N), abs=0.1)
    assert m.retrieval_acc >= 0.9


@pytest.mark.parametrize("N", [4, 16])
def test_ignoring_policy_is_blind(N):
    """Negative control: the same response distribution (non-uniform, so responses differ) whatever the distinct
    observation: every column is constant, MI = 0 and retrieval = 1/N (ties split)."""
    q = torch.softmax(torch.arange(N, dtype=torch.float32) / 3, dim=0)
    table = q.expand(N, N).contiguous()
    m = collapse_metrics(scripted_cross(table, list(range(N)), length=4, seed=0))
    assert m.mi == pytest.approx(0.0, abs=1e-9)
    assert m.retrieval_acc == pytest.approx(1 / N)


def test_weak_reader_sits_between():
    """A one-token policy that copies with probability 0.5 and otherwise answers from the blind distribution: MI
    strictly between the controls (longer responses push it towards log N: each token adds evidence)."""
    N = 8
    q = torch.softmax(torch.arange(N, dtype=torch.float32) / 3, dim=0)
    table = 0.5 * q.expand(N, N) + 0.5 * torch.eye(N)
    m = collapse_metrics(scripted_cross(table, list(range(N)), length=1, seed=0))
    assert 0.3 < m.mi < math.log(N) - 0.3
    assert 1 / N < m.retrieval_acc


def test_rectangular_with_owner():
    """Two responses per prompt: owner maps each column to its prompt; the result equals the square estimates of the
    two halves pooled."""
    gen = torch.Generator().manual_seed(2)
    cross = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    owner = torch.tensor([0, 1, 2, 0, 1, 2])
    expected = torch.cat([pointwise_mi(cross[:, :3]), pointwise_mi(cross[:, 3:])])
    torch.testing.assert_close(pointwise_mi(cross, owner), expected)
    with pytest.raises(ValueError, match="owner"):
        pointwise_mi(cross)
    with pytest.raises(ValueError, match="2 distinct prompts"):
        collapse_metrics(torch.zeros(1, 1))


def test_by_turn_uses_only_same_turn_blocks():
    """Turn 0 holds the worked example, turn 1 a blind 2-prompt block; entries across turns are NaN (never
    scored) and a lone turn-2 prompt is skipped."""
    cross = torch.full((6, 6), float("nan"), dtype=torch.float64)
    cross[:3, :3] = CROSS
    cross[3:5, 3:5] = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], dtype=torch.float64)
    cross[5, 5] = -1.0
    turn = torch.tensor([0, 0, 0, 1, 1, 2])
    out = collapse_metrics_by_turn(cross, turn)
    assert sorted(out.per_turn) == [0, 1]
    assert out.per_turn[0].mi == pytest.approx(math.log(1.5) / 3)
    assert (out.per_turn[1].mi, out.per_turn[1].retrieval_acc) == (pytest.approx(0.0), pytest.approx(0.5))
    # pooled over the 5 responses: mi (3 * log(1.5)/3 + 2 * 0) / 5; retrieval (3 * 2/3 + 2 * 1/2) / 5 = 3/5
    assert out.overall.mi == pytest.approx(math.log(1.5) / 5)
    assert out.overall.retrieval_acc == pytest.approx(0.6)
    assert out.overall.chance_acc == pytest.approx((3 / 3 + 2 / 2) / 5)
    assert out.overall.mi_bound == pytest.approx((3 * math.log(3) + 2 * math.log(2)) / 5)
    assert out.as_metrics()["collapse/turn_1/retrieval_acc"] == pytest.approx(0.5)


def test_distinct_prompts_dedupes_and_picks_deterministically():
    prompts = [[1, 2], [3], [1, 2], [4], [3], [5], [6], [7]]
    assert distinct_prompts(prompts) == [0, 1, 3, 5, 6, 7]
    assert distinct_prompts(prompts, limit=3) == [0, 3, 6]  # evenly over the six distinct prompts
    a = distinct_prompts(prompts, limit=3, generator=torch.Generator().manual_seed(5))
    b = distinct_prompts(prompts, limit=3, generator=torch.Generator().manual_seed(5))
    assert a == b and len(set(a)) == 3 and set(a) <= {0, 1, 3, 5, 6, 7}


def test_turn_pairs_and_pick_pairs():
    # row 0: prompt 10 11 | turn 0: 20 21 | obs 12 | turn 1: 22 | pad; row 1: prompt 10 11 | turn 0: 23 | pad
    ids = torch.tensor([[10, 11, 20, 21, 12, 22, 0], [10, 11, 23, 0, 0, 0, 0], [15, 16, 24, 0, 0, 0, 0]])
    attn = (torch.arange(7)[None, :] < torch.tensor([6, 3, 3])[:, None]).long()
    turns = torch.tensor([[-1, -1, 0, 0, -1, 1, -1], [-1, -1, 0, -1, -1, -1, -1], [-1, -1, 0, -1, -1, -1, -1]])
    pairs = turn_pairs(ids, attn, turns)
    assert pairs == [TurnPair(0, 0, [10, 11], [20, 21]), TurnPair(0, 1, [10, 11, 20, 21, 12], [22]),
                     TurnPair(1, 0, [10, 11], [23]), TurnPair(2, 0, [15, 16], [24])]
    # rows 0 and 1 share their turn-0 prompt: one of them is kept
    assert pick_pairs(pairs) == [pairs[0], pairs[3], pairs[1]]


@pytest.mark.parametrize("length", [1, 2])
def test_expectation_is_the_batch_mutual_information(length):
    """Averaged over the responses the policy samples, the estimate is exactly I(X; Z) with X uniform over the batch's
    distinct prompts (each column's expected pointwise MI is KL(p(. | x_j) || mean_i p(. | x_i)), so it is >= 0),
    although single batches can be negative. Enumerated exactly: every response sequence z over a vocab of 4, for a
    random conditional table of 3 prompts, tokens independent given the prompt."""
    gen = torch.Generator().manual_seed(3)
    table = torch.softmax(torch.randn(3, 4, generator=gen, dtype=torch.float64) * 1.5, dim=1)
    seqs = torch.cartesian_prod(*[torch.arange(4)] * length).reshape(-1, length)  # (V^length, length)
    cond = table[:, seqs].prod(dim=-1)  # (3, S): p(z | x_i) for every sequence z
    S = seqs.shape[0]
    # one column per (own prompt j, sequence z): cross = log p(z | x_i); owner = j
    cross = cond.log().repeat(1, 3)
    owner = torch.arange(3).repeat_interleave(S)
    pmi = pointwise_mi(cross, owner).reshape(3, S)
    expected = float((cond * pmi).sum(dim=1).mean())  # E over j uniform, z ~ p(. | x_j)
    marginal = cond.mean(dim=0)
    mutual_info = float(-(marginal * marginal.log()).sum() + (cond * cond.log()).sum(dim=1).mean())  # H(Z) - H(Z|X)
    assert expected == pytest.approx(mutual_info, rel=1e-9) and mutual_info > 0.05
    assert float(pmi.min()) < 0  # single responses (hence small batches) can fall below 0
