"""Hand-computed MS-GRPO / MS-PO examples on trajectories of different lengths (ragen.algorithms.turn_credit).

The turn that receives a tool result is named by the env's flag ``tool_results`` (B, K), never by the step reward.
Ahat = (x - mean) / (unbiased std + eps) over the group's valid rows. Every example goes through ``check``: the
vectorised implementation and the plain-loop reference agree, and both give the numbers derived in the comments.
"""

import torch
from estimator_helpers import D, check, replace

from ragen.algorithms import AdvantageInputs

# rows that call the tool: turn 0 on tokens 0-1, the tool result at 2, the answer (turn 1) on 3-4;
# rows that answer at once: turn 0 on tokens 0-1, then padding
TOOL_ROW, DIRECT_ROW = [0, 0, -1, 1, 1], [0, 0, -1, -1, -1]
S = 0.75 ** 0.5  # 0.866025


def t(*xs):
    return torch.tensor(xs, dtype=D)


def mixed_group() -> AdvantageInputs:
    """One group: rows 0, 1 call the tool (step reward 0.5, tool result at turn 0) then answer; rows 2, 3 answer at
    once. Outcomes [1, 0, 1, 0]."""
    tid = torch.tensor([TOOL_ROW, TOOL_ROW, DIRECT_ROW, DIRECT_ROW])
    return AdvantageInputs(
        token_rewards=torch.zeros(4, 5, dtype=D), response_mask=(tid >= 0).long(), turn_ids=tid,
        group_ids=torch.zeros(4, dtype=torch.long),
        step_rewards=t([0.5, 0.0], [0.5, 0.0], [0.0, 0.0], [0.0, 0.0]),
        outcome_rewards=t(1.0, 0.0, 1.0, 0.0),
        tool_results=torch.tensor([[True, False], [True, False], [False, False], [False, False]]),
    )


def test_ms_grpo_mixed_lengths_gives_the_step_term_to_tool_turns_only():
    adv, ret = check("ms_grpo", mixed_group(), step_advantage_coef=1.0)
    # Ahat(R^O): R^O = [1, 0, 1, 0], mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> [+S, -S, +S, -S]
    # Ahat_0(R^T_0) over all four rows: [0.5, 0.5, 0, 0], mean 0.25, std sqrt(4 * 0.0625 / 3) = 0.288675
    #   -> [+S, +S, -S, -S]; only rows 0, 1 received a tool result at turn 0
    # turn 0: rows 0, 1 get S + S = 1.732 and -S + S = 0; rows 2, 3 (no tool result) get Ahat(R^O) = +-0.866
    torch.testing.assert_close(adv[:, 0], t(2 * S, 0.0, S, -S), atol=1e-3, rtol=0)
    torch.testing.assert_close(adv[:, 0], t(1.732, 0.0, 0.866, -0.866), atol=1e-3, rtol=0)
    # turn 1 (the answer after the tool result, no tool result of its own): Ahat(R^O) = +-0.866
    torch.testing.assert_close(adv[:2, 3], t(0.866, -0.866), atol=1e-3, rtol=0)
    torch.testing.assert_close(adv[:, 1], adv[:, 0], atol=0, rtol=0)  # every token of a turn alike
    assert bool((adv[:, 2] == 0).all()) and bool((adv[2:, 3:] == 0).all()) and torch.equal(adv, ret)
    # c = 0.5 halves the step term only: turn 0 of row 0 = S + 0.5 S = 1.299, row 1 = -S + 0.5 S = -0.433
    adv_half, _ = check("ms_grpo", mixed_group(), step_advantage_coef=0.5)
    torch.testing.assert_close(adv_half[:, 0], t(1.299, -0.433, 0.866, -0.866), atol=1e-3, rtol=0)


def test_ms_po_mixed_lengths_splits_at_the_first_tool_result():
    adv, ret = check("ms_po", mixed_group(), discount_factor=1.0)
    # R^T + d R^O = [0.5 + 1, 0.5 + 0, 0 + 1, 0 + 0] = [1.5, 0.5, 1, 0]: mean 0.75, deviations
    #   [0.75, -0.25, 0.25, -0.75], unbiased std sqrt(1.25 / 3) = 0.645497 -> [1.162, -0.387, 0.387, -1.162]
    # turn 0: rows 0, 1 (tokens up to the tool result) and rows 2, 3 (no tool result: everywhere) get that
    torch.testing.assert_close(adv[:, 0], t(1.162, -0.387, 0.387, -1.162), atol=1e-3, rtol=0)
    # the answer turn after the tool result gets Ahat(R^O) = +-0.866 (normalised over all four rows)
    torch.testing.assert_close(adv[:2, 3], t(0.866, -0.866), atol=1e-3, rtol=0)
    assert torch.equal(adv, ret)
    # d = 0: R^T = [0.5, 0.5, 0, 0] -> [+S, +S, -S, -S] up to the tool result; the answer turn keeps Ahat(R^O)
    adv0, _ = check("ms_po", mixed_group(), discount_factor=0.0)
    torch.testing.assert_close(adv0[:, 0], t(S, S, -S, -S), atol=1e-3, rtol=0)
    torch.testing.assert_close(adv0[:2, 3], t(S, -S), atol=1e-3, rtol=0)


def test_ms_po_step_reward_is_the_sum_over_the_trajectorys_turns():
    # row 0 searches twice (step rewards 0.25 and 0.5, tool results at turns 0 and 1), then answers (turn 2); row 1
    # answers at once. R^O = [0, 0.5], d = 1.
    tid = torch.tensor([[0, -1, 1, -1, 2], [0, -1, -1, -1, -1]])
    inp = AdvantageInputs(
        token_rewards=torch.zeros(2, 5, dtype=D), response_mask=(tid >= 0).long(), turn_ids=tid,
        group_ids=torch.zeros(2, dtype=torch.long), step_rewards=t([0.25, 0.5, 0.0], [0.0, 0.0, 0.0]),
        outcome_rewards=t(0.0, 0.5), tool_results=torch.tensor([[True, True, False], [False, False, False]]),
    )
    adv, _ = check("ms_po", inp, discount_factor=1.0)
    # R^T = [0.25 + 0.5, 0] -> totals [0.75, 0.5]; two rows: Ahat = [+0.707, -0.707] (the first tool turn's reward
    # alone would give totals [0.25, 0.5] and the opposite signs)
    h = 0.5 ** 0.5
    torch.testing.assert_close(adv[:, 0], t(h, -h), atol=1e-5, rtol=0)
    # row 0's turns 1 and 2 come after its first tool result (turn 1 has a result of its own, it is still after the
    # first): Ahat(R^O) of [0, 0.5] = -0.707
    torch.testing.assert_close(adv[0, [2, 4]], t(-h, -h), atol=1e-5, rtol=0)


def test_failed_rows_are_excluded_from_every_statistic():
    # a fifth row of the same group whose env raised, with a tool result and extreme rewards: nothing changes for
    # the four valid rows, and it gets 0
    base = mixed_group()
    tid = torch.cat([base.turn_ids, torch.full((1, 5), -1)])  # a failed row has no model tokens left
    inp = replace(
        base, token_rewards=torch.zeros(5, 5, dtype=D), response_mask=(tid >= 0).long(), turn_ids=tid,
        group_ids=torch.zeros(5, dtype=torch.long), step_rewards=torch.cat([base.step_rewards, t([9.0, 9.0])]),
        outcome_rewards=torch.cat([base.outcome_rewards, t(9.0)]),
        tool_results=torch.cat([base.tool_results, torch.tensor([[True, True]])]),
        failed=torch.tensor([False, False, False, False, True]),
    )
    for name, kw in (("ms_grpo", dict(step_advantage_coef=1.0)), ("ms_po", dict(discount_factor=1.0))):
        adv, _ = check(name, inp, **kw)
        want, _ = check(name, base, **kw)
        torch.testing.assert_close(adv[:4], want, atol=1e-12, rtol=0)
        assert bool((adv[4] == 0).all())
    # the same row with model tokens but failed: still excluded
    tid_full = torch.cat([base.turn_ids, torch.tensor([TOOL_ROW])])
    adv, _ = check("ms_grpo", replace(inp, turn_ids=tid_full, response_mask=(tid_full >= 0).long()))
    torch.testing.assert_close(adv[:4, 0], t(2 * S, 0.0, S, -S), atol=1e-3, rtol=0)


def test_a_group_where_nobody_calls_the_tool():
    # three rows of 2, 1 and 2 turns, no tool result anywhere; row 1's only turn has a step reward of -0.5 (e.g. the
    # format penalty), which is not a tool result. Outcomes [1, 0, 0].
    tid = torch.tensor([[0, -1, 1], [0, -1, -1], [0, -1, 1]])
    inp = AdvantageInputs(
        token_rewards=torch.zeros(3, 3, dtype=D), response_mask=(tid >= 0).long(), turn_ids=tid,
        group_ids=torch.zeros(3, dtype=torch.long), step_rewards=t([0.0, 0.0], [-0.5, 0.0], [0.0, 0.0]),
        outcome_rewards=t(1.0, 0.0, 0.0), tool_results=torch.zeros(3, 2, dtype=torch.bool),
    )
    # MS-GRPO: Ahat(R^O) on every turn: mean 1/3, deviations [2/3, -1/3, -1/3], unbiased std sqrt((4 + 1 + 1) / 9
    #   / 2) = 0.57735 -> [1.1547, -0.5774, -0.5774]
    adv, _ = check("ms_grpo", inp)
    torch.testing.assert_close(adv[:, 0], t(1.1547, -0.5774, -0.5774), atol=1e-4, rtol=0)
    torch.testing.assert_close(adv[[0, 2], 2], t(1.1547, -0.5774), atol=1e-4, rtol=0)
    # MS-PO (d = 1): Ahat(R^T + R^O) on every turn: totals [1, -0.5, 0], mean 1/6, deviations [5/6, -2/3, -1/6],
    #   unbiased std sqrt((25 + 16 + 1) / 36 / 2) = 0.763763 -> [1.0911, -0.8729, -0.2182]
    adv, _ = check("ms_po", inp, discount_factor=1.0)
    torch.testing.assert_close(adv[:, 0], t(1.0911, -0.8729, -0.2182), atol=1e-4, rtol=0)
    torch.testing.assert_close(adv[[0, 2], 2], t(1.0911, -0.2182), atol=1e-4, rtol=0)


def test_the_flag_not_the_step_reward_decides_which_turn_gets_the_step_term():
    # two rows of one turn: row 0 received a tool result worth 0 (e.g. a search that found nothing useful), row 1
    # got a step reward of 0.4 without a tool result. R^O = [0, 0] -> Ahat(R^O) = 0.
    # Ahat_0(R^T_0) over both rows: [0, 0.4] -> [-0.707, +0.707]; only row 0 takes it
    tid = torch.tensor([[0], [0]])
    inp = AdvantageInputs(
        token_rewards=torch.zeros(2, 1, dtype=D), response_mask=torch.ones(2, 1, dtype=torch.long), turn_ids=tid,
        group_ids=torch.zeros(2, dtype=torch.long), step_rewards=t([0.0], [0.4]), outcome_rewards=t(0.0, 0.0),
        tool_results=torch.tensor([[True], [False]]),
    )
    adv, _ = check("ms_grpo", inp)
    torch.testing.assert_close(adv[:, 0], t(-(0.5 ** 0.5), 0.0), atol=1e-5, rtol=0)
