"""The test factories build records that keep the layout the records document (``tests/factories.py``)."""

import torch
from factories import padding_train_batch, prompt_response, random_rollout, rollout_batch, train_batch

from ragen.trainer.layout import pad_rows


def test_segments_make_right_padded_rows():
    b = train_batch(prompt_response([[5, 6, 7], [8]], [[30, 31], []]))
    assert b.input_ids.tolist() == [[5, 6, 7, 30, 31], [8, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert b.response_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]


def test_rollout_rows_put_each_turns_reward_on_its_last_model_token():
    b = rollout_batch([[([1, 2], -1), ([3, 4], 0), ([5], -1), ([6], 1)], [([7], -1), ([8, 9], 0)]],
                      [[0.5, 2.0], [1.0]], turn_rows=([0, 1], [1, 0]), failed=[False, False])
    assert b.turn_ids.tolist() == [[-1, -1, 0, 0, -1, 1], [-1, 0, 0, -1, -1, -1]]
    assert b.token_rewards.tolist() == [[0, 0, 0, 0.5, 0, 2.0], [0, 0, 1.0, 0, 0, 0]]
    assert b.turn_rewards.tolist() == [[0.5, 2.0], [1.0, 0.0]] and b.num_turns.tolist() == [2, 1]
    assert b.group_ids.tolist() == [0, 1] and not b.truncated.any()
    assert b.turn_index.tolist() == [1, 0] and b.select([1]).episode_index.tolist() == [1]


def test_random_rollout_has_the_documented_layout():
    b = random_rollout(n_groups=3, group_size=2, max_turns=3, seed=4)
    assert b.batch_size == 6 and b.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.equal(b.response_mask, (b.turn_ids >= 0).long())
    assert (b.attention_mask >= b.response_mask).all() and (b.sample_log_probs[b.response_mask == 0] == 0).all()
    assert (b.sample_log_probs[b.response_mask == 1] < 0).all()
    lengths = b.attention_mask.sum(1)
    assert len(set(lengths.tolist())) > 1 and (b.attention_mask[:, :-1] >= b.attention_mask[:, 1:]).all()  # ragged
    torch.testing.assert_close(b.token_rewards.sum(1), b.turn_rewards.sum(1))
    assert torch.equal(b.num_turns, b.turn_ids.amax(1) + 1)
    for g in range(3):  # the episodes of a group start from one prompt
        first, second = (row[: int((row >= 0).nonzero()[0])] for row in b.turn_ids[2 * g: 2 * g + 2])
        n = len(first)
        assert len(second) == n and torch.equal(b.input_ids[2 * g, :n], b.input_ids[2 * g + 1, :n])
    assert b.truncated.tolist() == [False, False, False, False, True, False]
    assert torch.equal(random_rollout(seed=4).input_ids, random_rollout(seed=4).input_ids)


def test_padding_rows_are_the_rows_the_turn_layout_pads_with():
    real = train_batch(prompt_response([[5, 6]], [[7]]))
    padded = pad_rows(real, 3, 0)
    pad = padding_train_batch(2, 3)
    assert torch.equal(padded.select([1, 2]).attention_mask, pad.attention_mask)
    assert torch.equal(padded.select([1, 2]).response_mask, pad.response_mask)
