"""A ragen trajectory row -> verl agent-loop fields, exact on a hand-built two-row batch with known token ids."""

from __future__ import annotations

import pytest
import torch
from ragen_external.verl import episode_to_agent_loop_output, place_turn_rewards, turn_level_rm_scores

from ragen.agent.batch import EpisodeRecord, RolloutBatch

PAD = 0
# row 0: prompt 11 12 13 | turn 0: 21 22 | env: 31 32 | turn 1: 41 42 43 | appended end-of-turn 99 | pad
# row 1: prompt 14 15    | turn 0: 51 (reward 0) | env: 61 | turn 1: 71 72 | env: 62 63 | turn 2: 81 (reward 2) | pad
IDS = [[11, 12, 13, 21, 22, 31, 32, 41, 42, 43, 99, PAD, PAD],
       [14, 15, 51, 61, 71, 72, 62, 63, 81, PAD, PAD, PAD, PAD]]  # fmt: skip
TURNS = [[-1, -1, -1, 0, 0, -1, -1, 1, 1, 1, -1, -1, -1],
         [-1, -1, 0, -1, 1, 1, -1, -1, 2, -1, -1, -1, -1]]  # fmt: skip
LENGTHS = [11, 9]
TURN_REWARDS = [[0.5, 1.0, 0.0], [0.0, -0.25, 2.0]]
NUM_TURNS = [2, 3]


def hand_batch(failed_row1: bool = False) -> RolloutBatch:
    ids, turn_ids = torch.tensor(IDS), torch.tensor(TURNS)
    attention = torch.zeros_like(ids)
    for i, n in enumerate(LENGTHS):
        attention[i, :n] = 1
    token_rewards = torch.zeros(ids.shape)
    log_probs = torch.zeros(ids.shape)
    for i in range(2):
        for k in range(NUM_TURNS[i]):
            token_rewards[i, int((turn_ids[i] == k).nonzero()[-1])] = TURN_REWARDS[i][k]
        log_probs[i] = torch.where(turn_ids[i] >= 0, -0.01 * (torch.arange(13) + 1) - i, 0.0)
    if failed_row1:  # what ragen's collate does to a failed env's row
        turn_ids[1], token_rewards[1], log_probs[1] = -1, 0.0, 0.0
    return RolloutBatch(
        input_ids=ids, attention_mask=attention, response_mask=(turn_ids >= 0).long(), turn_ids=turn_ids,
        token_rewards=token_rewards, sample_log_probs=log_probs, group_ids=torch.tensor([0, 0]),
        turn_rewards=torch.tensor(TURN_REWARDS), num_turns=torch.tensor(NUM_TURNS),
        truncated=torch.tensor([False, True]),
        episodes=[EpisodeRecord("bandit", 3, 0, success=True), EpisodeRecord("bandit", 3, 0, failed=failed_row1)],
        extra={"failed": torch.tensor([False, failed_row1])},
    )  # fmt: skip


def test_conversion_is_exact():
    batch = hand_batch()
    a = episode_to_agent_loop_output(batch, 0)
    assert a.prompt_ids == [11, 12, 13]
    assert a.response_ids == [21, 22, 31, 32, 41, 42, 43]  # the appended end-of-turn 99 (mask 0) is dropped
    assert a.response_mask == [1, 1, 0, 0, 1, 1, 1]
    assert a.token_rewards == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert a.reward_positions == [1, 6]
    assert a.turn_rewards == [0.5, 1.0]
    assert a.reward_score == pytest.approx(1.5)
    assert a.num_turns == 4
    assert a.response_logprobs == pytest.approx([-0.04, -0.05, 0, 0, -0.08, -0.09, -0.10])
    assert a.metrics == {"success": 1.0, "failed": 0.0, "truncated": 0.0, "turns": 2.0}

    b = episode_to_agent_loop_output(batch, 1)
    assert b.prompt_ids == [14, 15]
    assert b.response_ids == [51, 61, 71, 72, 62, 63, 81]
    assert b.response_mask == [1, 0, 1, 1, 0, 0, 1]
    assert b.token_rewards == [0.0, 0.0, 0.0, -0.25, 0.0, 0.0, 2.0]  # a zero-reward turn is still a turn
    assert b.reward_positions == [0, 3, 6]
    assert b.reward_score == pytest.approx(1.75)
    assert b.num_turns == 6
    assert b.metrics["truncated"] == 1.0 and b.metrics["success"] == 0.0

    rm = turn_level_rm_scores([a.token_rewards, b.token_rewards], 9)
    assert rm.tolist() == [[0, 0.5, 0, 0, 0, 0, 1.0, 0, 0], [0, 0, 0, -0.25, 0, 0, 2.0, 0, 0]]
    with pytest.raises(ValueError, match="exceed response_length=6"):
        turn_level_rm_scores([a.token_rewards], 6)


def test_failed_episode_trains_nothing():
    ep = episode_to_agent_loop_output(hand_batch(failed_row1=True), 1)
    assert ep.prompt_ids == IDS[1][:9] and ep.response_ids == [] and ep.response_mask == []
    assert ep.reward_score == 0.0 and ep.metrics["failed"] == 1.0


def test_place_turn_rewards_keeps_other_rows():
    rm = torch.tensor([[0, 0, 1.5, 0], [0, 0.75, 0, 0], [0, 0, 0, 3.0]])
    out = place_turn_rewards(rm, torch.tensor([3, 2, 4]), [[0.5, 0, 1.0], None, [1.0, 0, 2.0, 0]])
    assert out.tolist() == [[0.5, 0, 1.0, 0], [0, 0.75, 0, 0], [1.0, 0, 2.0, 0]] and rm[0, 2] == 1.5  # a new tensor
    with pytest.raises(ValueError, match="row 0: 2 ragen_token_rewards for a response of 3 tokens"):
        place_turn_rewards(rm, torch.tensor([3, 2, 4]), [[0.5, 1.0], None, None])
    with pytest.raises(ValueError, match="row 2: rm_scores sum 3.0"):
        place_turn_rewards(rm, torch.tensor([3, 2, 4]), [None, None, [1.0, 0, 1.0, 0]])


def test_verl_output_places_rewards_per_turn():
    verl_loop = pytest.importorskip(
        "verl.experimental.agent_loop.agent_loop",
        reason="verl 0.9.1 is not importable: install it with `bash scripts/setup_verl.sh` (external/verl/README.md)",
        exc_type=ImportError,
    )
    from ragen_external.verl.agent_loop import to_agent_loop_output

    out = to_agent_loop_output(episode_to_agent_loop_output(hand_batch(), 1))
    assert isinstance(out, verl_loop.AgentLoopOutput)
    d = out.as_dict()  # verl's own tensors
    assert d["prompts"].tolist() == [14, 15]
    assert d["responses"].tolist() == [51, 61, 71, 72, 62, 63, 81]
    assert d["response_mask"].tolist() == [1, 0, 1, 1, 0, 0, 1]
    assert d["rm_scores"].tolist() == [0, 0, 0, -0.25, 0, 0, 2.0]  # ragen's placement (RagenAgentLoopOutput)
    assert out.reward_score == 1.75
    assert out.extra_fields["turn_scores"] == [0.0, -0.25, 2.0]
    assert out.extra_fields["ragen_token_rewards"] == [0.0, 0.0, 0.0, -0.25, 0.0, 0.0, 2.0]
