"""The merge rule: hand-built token sequences that merge, fork in the middle, fork when thinking is stripped, and
the exactness invariants over random episodes."""

import random

import pytest

from ragen.gateway.record import CallRecord, Fork, merge_calls, merge_counters


def call(prompt, sampled, request="r", sample=0, lp0=-0.5):
    return CallRecord("ep", request, sample, tuple(prompt), tuple(sampled),
                      tuple(lp0 - 0.01 * j for j in range(len(sampled))), "stop")


def test_three_calls_merge_into_one_row():
    c0 = call([1, 2, 3], [10, 11, 2], "a")
    c1 = call([1, 2, 3, 10, 11, 2, 7, 8], [12, 2], "b", lp0=-1.0)
    c2 = call([1, 2, 3, 10, 11, 2, 7, 8, 12, 2, 9], [13], "c", lp0=-2.0)
    out = merge_calls([c0, c1, c2])
    assert out.forks == [] and out.merged == 2 and out.layout == "trajectory"
    (row,) = out.rows
    assert row.ids == [1, 2, 3, 10, 11, 2, 7, 8, 12, 2, 9, 13]
    assert row.model_mask == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1]
    assert row.turn_ids == [-1, -1, -1, 0, 0, 0, -1, -1, 1, 1, -1, 2]
    assert row.log_probs == pytest.approx([0, 0, 0, -0.5, -0.51, -0.52, 0, 0, -1.0, -1.01, 0, -2.0])
    assert row.calls == [0, 1, 2]
    assert merge_counters([out]) == {"gateway/merged_turns": 2.0, "gateway/forks": 0.0}


def test_a_middle_token_that_differs_forks():
    c0 = call([1, 2, 3], [10, 11, 2], "a")
    c1 = call([1, 2, 99, 10, 11, 2, 7], [12], "b")  # history re-rendered at position 2 (in the prompt part)
    c2 = call([1, 2, 99, 10, 11, 2, 7, 12, 5], [14], "c")  # continues c1: merges into c1's row
    out = merge_calls([c0, c1, c2])
    assert out.forks == [Fork(1, "prefix_mismatch", 2, "prompt")]
    assert [r.calls for r in out.rows] == [[0], [1, 2]] and out.layout == "turn"
    assert [r.index for r in out.rows] == [0, 1]
    assert out.rows[0].ids == [1, 2, 3, 10, 11, 2] and out.rows[0].turn_ids == [-1, -1, -1, 0, 0, 0]
    assert out.rows[1].ids == [1, 2, 99, 10, 11, 2, 7, 12, 5, 14]
    assert out.rows[1].turn_ids == [-1] * 7 + [1, -1, 2]  # the copied 10, 11, 2 are prompt tokens here
    assert merge_counters([out]) == {"gateway/merged_turns": 1.0, "gateway/forks": 1.0,
                                     "gateway/forks/prefix_mismatch": 1.0}


def test_stripped_thinking_forks_in_the_completion():
    think, answer, end = [50, 51, 52, 53], [60, 61], [2]  # <think> .. </think> answer <|im_end|>
    c0 = call([1, 2], think + answer + end, "a")
    c1 = call([1, 2] + answer + end + [7], [70, 2], "b")  # the template dropped the thinking
    out = merge_calls([c0, c1])
    assert out.forks == [Fork(1, "prefix_mismatch", 2, "completion")]
    assert [r.ids for r in out.rows] == [[1, 2, 50, 51, 52, 53, 60, 61, 2], [1, 2, 60, 61, 2, 7, 70, 2]]
    assert out.rows[1].model_mask == [0, 0, 0, 0, 0, 0, 1, 1]


def test_shorter_prompt_and_siblings():
    c0 = call([1, 2, 3], [10, 11], "a")
    short = call([1, 2, 3, 10], [12], "b")  # the program dropped the last sampled token
    assert merge_calls([c0, short]).forks == [Fork(1, "shorter_prompt")]
    s0, s1 = call([1, 2], [10, 2], "g", 0), call([1, 2], [20, 2], "g", 1)
    nxt = call([1, 2, 20, 2, 7], [30], "h")  # continues the second sample of request g
    out = merge_calls([s0, s1, nxt])
    assert out.forks == [Fork(1, "sibling")] and out.merged == 1
    assert [r.calls for r in out.rows] == [[0], [1, 2]]
    assert out.rows[1].turn_ids == [-1, -1, 1, 1, -1, 2]


def test_empty_sample_takes_no_turn_number():
    c0 = call([1], [], "a")
    c1 = call([1, 5], [6], "b")
    out = merge_calls([c0, c1])
    assert out.merged == 1 and out.rows[0].turn_ids == [-1, -1, 0]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 sampled ids but 1 log-probs"):
        CallRecord("e", "r", 0, (1,), (2, 3), (-0.1,), "stop")


def random_episode(rng: random.Random) -> list[CallRecord]:
    """Calls that continue the previous row, or perturb it (re-rendered token, drop, restart), or resample."""
    calls, tip = [], [rng.randrange(100) for _ in range(rng.randrange(1, 5))]
    for r in range(rng.randrange(1, 8)):
        kind = rng.random()
        if calls and kind < 0.15:
            prompt = list(calls[-1].prompt_ids)  # a second request with the same prompt
        elif calls and kind < 0.35:
            prompt = list(tip)
            prompt[rng.randrange(len(prompt))] += 1000
        elif calls and kind < 0.45:
            prompt = tip[: rng.randrange(len(tip))]
        else:
            prompt = tip + [rng.randrange(100) for _ in range(rng.randrange(0, 4))]
        n = 1 + (rng.random() < 0.2)
        for s in range(n):
            sampled = [rng.randrange(100) for _ in range(rng.randrange(0, 4))]
            calls.append(call(prompt, sampled, f"req{r}", s, lp0=-rng.random()))
        tip = list(calls[-1].prompt_ids) + list(calls[-1].sampled_ids)
    return calls


@pytest.mark.parametrize("seed", range(200))
def test_rows_hold_only_sampled_tokens_and_seen_prompts(seed):
    """Every model token of every row is a token some call sampled at that place, with that log-prob; each call's
    place in its row is preceded by exactly that call's prompt; turn ids run 0..n-1 in row order."""
    calls = random_episode(random.Random(seed))
    out = merge_calls(calls)
    assert sorted(c for r in out.rows for c in r.calls) == list(range(len(calls)))
    assert len(out.rows) == 1 + len(out.forks) and out.merged == len(calls) - len(out.rows)
    seen_turns = []
    for row in out.rows:
        assert len(row.ids) == len(row.log_probs) == len(row.turn_ids)
        covered = [False] * len(row.ids)
        for c in row.calls:
            rec = calls[c]
            p, n = len(rec.prompt_ids), len(rec.sampled_ids)
            assert tuple(row.ids[:p]) == rec.prompt_ids  # the prompt part before this call is what it saw
            assert tuple(row.ids[p:p + n]) == rec.sampled_ids
            assert tuple(row.log_probs[p:p + n]) == rec.log_probs
            assert all(row.turn_ids[p + j] >= 0 for j in range(n))
            for j in range(n):
                covered[p + j] = True
        assert covered == [k >= 0 for k in row.turn_ids]  # model tokens are exactly the calls' samples
        assert all(lp == 0.0 for lp, k in zip(row.log_probs, row.turn_ids, strict=True) if k < 0)
        seen_turns += list(dict.fromkeys(k for k in row.turn_ids if k >= 0))
    assert seen_turns == list(range(len(seen_turns)))


def test_random_episodes_both_merge_and_fork():
    """The invariant test above sees every case: merges and each fork reason."""
    counters = merge_counters(merge_calls(random_episode(random.Random(seed))) for seed in range(200))
    assert counters["gateway/merged_turns"] > 100
    for reason in ("prefix_mismatch", "shorter_prompt", "sibling"):
        assert counters[f"gateway/forks/{reason}"] > 10
