"""Rewards of agent-program episodes (``ragen.agent.program_batch``, ``ragen.gateway.program``): a returned number
on the last model token of the last call, per-call rewards on each call's last model token, and the format penalty
on each call whose completion was a malformed tool call. Positions are hand-computed on hand-built records."""

import pytest
import torch

from ragen.agent.program_batch import ProgramEpisode, program_batch
from ragen.gateway.program import ProgramResult, _result, call_rewards
from ragen.gateway.record import CallRecord
from ragen.gateway.toolcalls import ToolCallParse

PAD = 0
BAD = ToolCallParse(content="<tool_call>{oops", malformed=True, raw="<tool_call>{oops", error="invalid JSON")


def call(rid, prompt, sampled, malformed=False, sample_index=0):
    lps = tuple(-0.1 * (i + 1) for i in range(len(sampled)))
    parse = BAD if malformed else ToolCallParse(content="x")
    return CallRecord("ep", rid, sample_index, tuple(prompt), tuple(sampled), lps, "stop", parse)


# Three calls that merge into one row: [1 2 3 | 10 11 | 4 5 | 12 | 6 | 13 14 15]
#                             positions  0 1 2   3  4   5 6   7    8   9 10 11
# the first call's completion is a malformed tool call; model tokens end at 4, 7 and 11.
MERGED = [call("r0", [1, 2, 3], [10, 11], malformed=True),
          call("r1", [1, 2, 3, 10, 11, 4, 5], [12]),
          call("r2", [1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14, 15])]


def episode(calls, reward=0.0, call_rewards=None, failed=False):
    return ProgramEpisode(list(calls), reward, failed, "", 0, 7, ["t"] * len(calls), call_rewards)


def nonzero(row):
    return {int(t): round(float(row[t]), 6) for t in row.nonzero().flatten()}


def test_a_returned_number_sits_on_the_last_call_and_the_penalty_on_the_malformed_one():
    batch = program_batch([episode(MERGED, reward=1.0)], "trajectory", PAD, format_penalty=-0.5)
    assert batch.input_ids[0].tolist() == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14, 15]
    assert batch.turn_ids[0].tolist() == [-1, -1, -1, 0, 0, -1, -1, 1, -1, 2, 2, 2]
    assert nonzero(batch.token_rewards[0]) == {4: -0.5, 11: 1.0}
    assert batch.turn_rewards[0].tolist() == [-0.5, 0.0, 1.0]
    assert batch.metrics["env/agent_program/reward"] == pytest.approx(0.5)
    assert batch.metrics["env/agent_program/success"] == 1.0  # the program's reward, 1.0 > 0
    assert [t.reward for t in batch.episodes[0].turns] == [-0.5, 0.0, 1.0]
    # the penalty is the config's: 0 leaves the return value alone, another value moves the malformed call's reward
    assert nonzero(program_batch([episode(MERGED, reward=1.0)], "trajectory", PAD, 0.0).token_rewards[0]) == {
        11: 1.0}
    assert nonzero(program_batch([episode(MERGED, reward=1.0)], "trajectory", PAD, -0.1).token_rewards[0]) == {
        4: -0.1, 11: 1.0}


def test_per_call_rewards_sit_on_each_calls_last_model_token():
    ep = episode(MERGED, reward=1.5, call_rewards=[0.25, 0.5, 0.75])
    batch = program_batch([ep], "trajectory", PAD, format_penalty=-0.5)
    assert nonzero(batch.token_rewards[0]) == {4: -0.25, 7: 0.5, 11: 0.75}
    assert batch.turn_rewards[0].tolist() == [-0.25, 0.5, 0.75]
    assert batch.metrics["env/agent_program/reward"] == pytest.approx(1.0)


@pytest.mark.parametrize("layout", ["trajectory", "turn"])
def test_per_call_rewards_of_a_forked_episode(layout):
    # the second prompt does not extend the first row (position 2 differs): two rows [1 2 3 10 11], [1 2 9 20 21]
    calls = [call("r0", [1, 2, 3], [10, 11], malformed=True), call("r1", [1, 2, 9], [20, 21])]
    batch = program_batch([episode(calls, 1.0, [0.25, 0.75])], layout, PAD, format_penalty=-0.5)
    if layout == "trajectory":  # the one row is masked: it trains nothing
        assert batch.batch_size == 1 and batch.token_rewards.abs().sum() == 0 and batch.context_cut.tolist() == [True]
        return
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11], [1, 2, 9, 20, 21]]
    assert nonzero(batch.token_rewards[0]) == {4: -0.25} and nonzero(batch.token_rewards[1]) == {4: 0.75}
    assert batch.turn_rewards.tolist() == [[-0.25, 0.75], [-0.25, 0.75]]


def test_a_call_without_sampled_tokens_gives_its_reward_to_the_last_trained_call():
    calls = [call("r0", [1, 2], [10]), call("r1", [1, 2, 10, 3], [])]
    batch = program_batch([episode(calls, 0.75, [0.5, 0.25])], "trajectory", PAD, format_penalty=-0.5)
    assert batch.input_ids[0].tolist() == [1, 2, 10, 3]
    assert nonzero(batch.token_rewards[0]) == {2: 0.75} and batch.turn_rewards[0].tolist() == [0.75]


def test_a_failed_episode_gets_no_reward_and_no_penalty():
    batch = program_batch([episode(MERGED, 1.0, [0.25, 0.5, 0.75], failed=True)], "turn", PAD, format_penalty=-0.5)
    assert batch.token_rewards.abs().sum() == 0 and batch.turn_rewards.abs().sum() == 0
    assert batch.response_mask.sum() == 0


def test_return_values():
    assert _result("e", 2) == ProgramResult("e", 2.0)
    per = _result("e", {"chatcmpl-a": 0.5, "chatcmpl-b": [1, 0.25]})
    assert per.per_call == {"chatcmpl-a": (0.5,), "chatcmpl-b": (1.0, 0.25)} and per.reward == 1.75
    for bad in (True, float("nan"), "1", None, {"chatcmpl-a": "x"}, {"chatcmpl-a": []}, {1: 0.5},
                {"chatcmpl-a": [0.5, float("inf")]}):
        with pytest.raises(ValueError, match="it must return a finite number"):
            _result("e", bad)


def test_call_rewards_by_response_id():
    calls = [call("a", [1], [2]), call("b", [1, 2, 3], [4], sample_index=0), call("b", [1, 2, 3], [5], sample_index=1)]
    assert call_rewards(calls, {"chatcmpl-b": (0.25, 0.75)}) == [0.0, 0.25, 0.75]
    assert call_rewards(calls, {"chatcmpl-a": (1.0,), "chatcmpl-b": (0.5,)}) == [1.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="'chatcmpl-c', which is no response id of its episode"):
        call_rewards(calls, {"chatcmpl-c": (1.0,)})
    with pytest.raises(ValueError, match="3 rewards for 'chatcmpl-b', which has 2 choice"):
        call_rewards(calls, {"chatcmpl-b": (1.0, 2.0, 3.0)})
    assert torch.tensor(call_rewards(calls, {})).abs().sum() == 0
