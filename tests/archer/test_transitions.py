"""Turn rows -> replay records: (s, a, r, s', done), trajectory reward and MC return; records -> policy batches."""

import pytest
import torch

from ragen.agent.batch import RolloutBatch
from ragen.archer.transitions import policy_batch, transitions_from_batch


def _batch(truncated: bool) -> RolloutBatch:
    # episode 0: turn 0 = prompt [1, 2] + response [3, 4]; turn 1 = prompt [1, 2, 3, 4, 5] + response [6];
    # episode 1 failed (placeholder row). Pad id 0.
    ids = torch.tensor([[1, 2, 3, 4, 0, 0], [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0]])
    resp = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    turn = torch.where(resp.bool(), torch.tensor([[0], [1], [-1]]).expand(3, 6), torch.full((3, 6), -1))
    rewards = torch.tensor([[-1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]])
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp, turn_ids=turn, token_rewards=torch.zeros(3, 6),
        sample_log_probs=torch.zeros(3, 6), group_ids=torch.tensor([0, 0, 1]), turn_rewards=rewards,
        num_turns=torch.tensor([2, 2, 0]), truncated=torch.tensor([truncated, truncated, False]),
        episode_index=torch.tensor([0, 0, 1]), turn_index=torch.tensor([0, 1, -1]),
        failed=torch.tensor([False, False, True]))


def _decode(ids):
    return " ".join(map(str, ids))


def test_records_of_one_episode():
    recs, totals = transitions_from_batch(_batch(truncated=False), _decode, gamma=0.5, first_episode=7)
    assert totals == [-1.0]  # the failed episode is skipped
    assert [(r.state, r.action, r.next_state, r.done) for r in recs] == [
        ("1 2", "3 4", "1 2 3 4 5", False), ("1 2 3 4 5", "6", "1 2 3 4 5 6", True)]
    assert [r.reward for r in recs] == [-1.0, 0.0]
    assert [r.mc_return for r in recs] == pytest.approx([-1.0, 0.0])
    assert [(r.prompt_ids, r.action_ids, r.episode, r.turn) for r in recs] == [
        ([1, 2], [3, 4], 7, 0), ([1, 2, 3, 4, 5], [6], 7, 1)]
    assert all(r.traj_reward == -1.0 for r in recs)


def test_a_length_cut_episode_bootstraps():
    recs, _ = transitions_from_batch(_batch(truncated=True), _decode, gamma=0.5)
    assert [r.done for r in recs] == [False, False]


def test_policy_batch_masks_the_actions():
    tb = policy_batch([[1, 2], [5]], [[3], [6, 7]], pad_id=0, advantages=torch.tensor([0.5, -1.0]),
                      log_probs=[[-0.1], [-0.2, -0.3]])
    assert tb.input_ids.tolist() == [[1, 2, 3], [5, 6, 7]]
    assert tb.response_mask.tolist() == [[0, 0, 1], [0, 1, 1]]
    assert tb.advantages.tolist() == [[0.0, 0.0, 0.5], [0.0, -1.0, -1.0]]
    assert torch.allclose(tb.old_log_probs, torch.tensor([[0.0, 0.0, -0.1], [0.0, -0.2, -0.3]]))


def test_a_turn_before_an_empty_response_still_bootstraps():
    """Episode of 3 turns whose turn 1 response was empty (its row is prompt + end-of-turn, no model token): turn 0
    is not terminal (s' = turn 1's prompt), turn 1 is a record without action tokens, and only turn 2, the
    episode's last, is done."""
    eot = 9
    ids = torch.tensor([[1, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, eot, 0, 0], [1, 2, 3, 4, eot, 5, 6]])
    resp = torch.tensor([[0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1]])
    attn = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    batch = RolloutBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp, turn_ids=torch.where(resp.bool(), 0, -1),
        token_rewards=torch.zeros(3, 7), sample_log_probs=torch.zeros(3, 7), group_ids=torch.zeros(3).long(),
        turn_rewards=torch.tensor([[-1.0, -1.0, 0.0]] * 3), num_turns=torch.tensor([3, 3, 3]),
        truncated=torch.tensor([False] * 3),
        episode_index=torch.tensor([0, 0, 0]), turn_index=torch.tensor([0, 1, 2]))
    recs, totals = transitions_from_batch(batch, _decode, gamma=1.0)
    assert totals == [-2.0]
    assert [(r.state, r.action, r.next_state, r.done) for r in recs] == [
        ("1 2", "3", "1 2 3 4", False), ("1 2 3 4", "", "1 2 3 4 9 5", False),
        ("1 2 3 4 9 5", "6", "1 2 3 4 9 5 6", True)]
    assert [r.action_ids for r in recs] == [[3], [], [6]] and [r.mc_return for r in recs] == [-2.0, -1.0, 0.0]
