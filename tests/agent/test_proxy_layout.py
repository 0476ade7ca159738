"""Exact token layout of a scripted 3-turn rollout (docs/design.md, the token layout)."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec

SPECIAL = re.compile(r"<s>|<\|end\|>|<\|system\|>|<\|user\|>|<\|assistant\|>")


def n_tok(text: str) -> int:
    """Token count under the char tokenizer: one per special token, one per other character."""
    return len(SPECIAL.sub("#", text))


def responses(tok):
    """Env 0 answers right with a think block of k+1 x's (lengths differ per turn); env 1 answers 'up'."""

    def script(call: int, i: int, prompt: list[int]) -> list[int]:
        text = f"<think>{'x' * (call + 1)}</think><answer>right</answer>" if i == 0 else "<answer>up</answer>"
        return tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|end|>")]

    return script


def test_three_turn_positions(char_tok, fake_engine):
    engine = fake_engine(responses(char_tok))
    cfg = AgentConfig(max_turn=3, think=False, max_model_len=4096, max_new_tokens=64)
    proxy = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {}, n_groups=1, group_size=2)], [])
    batch = proxy.rollout("train")
    ep = batch.episodes[0]
    u = [t.prompt_text for t in ep.turns]
    r = [n_tok(f"<think>{'x' * (k + 1)}</think><answer>right</answer><|end|>") for k in range(3)]
    p0 = n_tok(f"<s><|user|>Walk on a line.\n\n{u[0]}<|end|>\n<|assistant|>")
    env = [n_tok(f"\n<|user|>{u[k]}<|end|>\n<|assistant|>") for k in (1, 2)]
    starts = [p0, p0 + r[0] + env[0], p0 + r[0] + env[0] + r[1] + env[1]]
    total = starts[2] + r[2]

    mask = torch.zeros(batch.seq_len, dtype=torch.long)
    tids = torch.full((batch.seq_len,), -1, dtype=torch.long)
    rew = torch.zeros(batch.seq_len)
    for k in range(3):
        mask[starts[k] : starts[k] + r[k]] = 1
        tids[starts[k] : starts[k] + r[k]] = k
    rew[starts[0] + r[0] - 1] = 1.0  # env rewards (1, 0, 2): the middle turn has reward 0
    rew[starts[2] + r[2] - 1] = 2.0
    assert int(batch.attention_mask[0].sum()) == total
    assert torch.equal(batch.response_mask[0], mask)
    assert torch.equal(batch.turn_ids[0], tids)
    assert torch.equal(batch.token_rewards[0], rew)
    assert batch.turn_rewards[0].tolist() == [1.0, 0.0, 2.0]
    assert batch.num_turns.tolist() == [3, 3]
    assert batch.truncated.tolist() == [False, False]  # env 1 hit max_turn: a true end (not a length budget)
    assert batch.group_ids.tolist() == [0, 0]
    # Token in / token out: each engine prompt is a prefix of the row, and the sampled ids sit at their place.
    for k, (prompts, sampling) in enumerate(engine.calls):
        assert len(prompts[0]) == starts[k]
        assert batch.input_ids[0, : starts[k]].tolist() == prompts[0]
        sampled = responses(char_tok)(k, 0, [])
        assert batch.input_ids[0, starts[k] : starts[k] + r[k]].tolist() == sampled
        expected_lp = [-(k + 1) * 0.01 - j * 0.001 for j in range(r[k])]
        got_lp = batch.sample_log_probs[0, starts[k] : starts[k] + r[k]].tolist()
        assert got_lp == [float(torch.tensor(x)) for x in expected_lp]
        assert sampling.stop_token_ids == (char_tok.convert_tokens_to_ids("<|end|>"),)
    # Env tokens between turns: the template's separator, then the new user message alone.
    between = char_tok.decode(batch.input_ids[0, starts[0] + r[0] : starts[1]].tolist())
    assert between == f"\n<|user|>{u[1]}<|end|>\n<|assistant|>"
    # Right padding with the pad id; nothing nonzero outside the real tokens.
    assert (batch.input_ids[0, total:] == char_tok.pad_token_id).all()
    assert batch.sample_log_probs[batch.response_mask == 0].abs().sum() == 0
    assert batch.turn_obs_keys[0] == ["pos=0", "pos=1", "pos=2"]
    assert batch.metrics["env/test_line/success"] == 0.5
    assert batch.metrics["env/test_line/valid_action_ratio"] == 0.5
    assert batch.metrics["env/test_line/turns"] == 3.0
    assert batch.step_rewards is None and batch.outcome_rewards is None
    assert "You have 3 action(s) left" in u[0] and "You have 1 action(s) left" in u[2]


def test_turn_layout_rows_are_exact_prompts(char_tok, fake_engine):
    engine = fake_engine(responses(char_tok))
    cfg = AgentConfig(max_turn=3, think=False, layout="turn", max_context_window=1)
    proxy = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {}, n_groups=1, group_size=2)], [])
    batch = proxy.rollout()
    assert batch.batch_size == 6
    assert batch.episode_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.turn_index.tolist() == [0, 1, 2, 0, 1, 2]
    for row in range(6):
        e, k = int(batch.episode_index[row]), int(batch.turn_index[row])
        prompt = engine.calls[k][0][e]
        n = len(prompt)
        assert batch.input_ids[row, :n].tolist() == prompt
        sampled = responses(char_tok)(k, e, [])
        assert batch.input_ids[row, n : n + len(sampled)].tolist() == sampled
        assert batch.response_mask[row].sum() == len(sampled)
        assert set(batch.turn_ids[row][batch.response_mask[row] == 1].tolist()) == {k}
        assert float(batch.token_rewards[row, n + len(sampled) - 1]) == float(batch.turn_rewards[row, k])
    # window = 1: turn 2's prompt starts with a fresh first message holding turn 1's observation.
    assert char_tok.decode(engine.calls[2][0][0]).startswith("<s><|user|>Walk on a line.\n\nTurn 2. State:\npos=1")
    assert batch.context_cut.all()


def test_trajectory_rows_with_cut_history_train_nothing(char_tok, monkeypatch, fake_engine):
    """A trajectory row whose history was cut for some turn is not what the model saw: it is masked out of
    training (turn ids -1, so the turn-id contract holds), counted in ``rollout/context_cut_ratio``, and the
    first such batch of the run warns once, recommending ``agent.layout=turn``. The turn layout keeps the rows."""
    from ragen.agent import collate

    monkeypatch.setitem(collate._state, "warned_context_cut", False)
    new = 64
    probe = fake_engine(responses(char_tok))
    spec = [EnvGroupSpec("test_line", {}, n_groups=1, group_size=2)]
    AgentProxy(probe, char_tok, AgentConfig(max_turn=3, think=False, max_new_tokens=new), spec, []).rollout()
    p2 = [len(p) for p in probe.calls[2][0]]
    assert p2[0] > p2[1]  # env 0 answers with longer responses: only its turn-2 prompt will not fit
    cfg = AgentConfig(max_turn=3, think=False, max_new_tokens=new, max_model_len=p2[1] + new)
    proxy = AgentProxy(fake_engine(responses(char_tok)), char_tok, cfg, spec, [])
    with pytest.warns(UserWarning, match="agent.layout=turn"):
        batch = proxy.rollout()
    assert batch.context_cut.tolist() == [True, False]
    assert batch.metrics["rollout/context_cut_ratio"] == 0.5
    assert int(batch.response_mask[0].sum()) == 0 and (batch.turn_ids[0] == -1).all()
    assert batch.token_rewards[0].abs().sum() == 0 and batch.sample_log_probs[0].abs().sum() == 0
    assert int(batch.response_mask[1].sum()) == 3 * len(responses(char_tok)(0, 1, []))
    assert torch.equal(batch.turn_ids >= 0, batch.response_mask == 1)  # the turn-id contract
    assert batch.num_turns.tolist() == [3, 3]  # the episode itself is complete
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per run: the next cut batch does not warn again
        proxy.rollout()
    turn = AgentProxy(fake_engine(responses(char_tok)), char_tok, dataclasses.replace(cfg, layout="turn"),
                      spec, []).rollout()
    assert turn.metrics["rollout/context_cut_ratio"] == 0.5
    assert (turn.response_mask.sum(dim=1) > 0).all()  # turn rows hold the exact prompts: all train


@pytest.mark.parametrize("layout", ["trajectory", "turn"])
def test_empty_response_keeps_its_reward_and_valid_turn_ids(char_tok, fake_engine, layout):
    """An engine that returns an empty sample for turn 1: the turn's reward (the format penalty) is merged into turn
    0, every reward reaches the token rewards, turn ids stay 0..n-1 and every estimator runs on the batch."""
    from ragen.trainer.credit import advantages
    from ragen.trainer.layout import turn_layout_advantages

    right = char_tok("<answer>right</answer>", add_special_tokens=False)["input_ids"]
    right += [char_tok.convert_tokens_to_ids("<|end|>")]

    def script(call, i, prompt):
        return [] if call == 1 and i == 0 else right  # env 0's turn 1: an empty sample

    spec = [EnvGroupSpec("test_line", {"rewards": (1.0, 0.5, 2.0)}, n_groups=1, group_size=2)]
    cfg = AgentConfig(max_turn=3, think=False, max_new_tokens=64, layout=layout)
    batch = AgentProxy(fake_engine(script), char_tok, cfg, spec, []).rollout()
    first = {e: r for r, e in reversed(list(enumerate(batch.episode_index.tolist())))}
    row0 = first[0]
    # env 0: turn 0 steps right (reward 1.0), turn 1 is empty (format penalty -0.1), turn 2 steps right (0.5)
    assert batch.num_turns[row0] == 3
    assert batch.turn_rewards[row0].tolist() == pytest.approx([0.9, 0.5, 0.0])
    rows0 = [r for r in range(batch.batch_size) if batch.episode_index[r] == 0]
    assert float(batch.token_rewards[rows0].sum()) == pytest.approx(1.4)  # nothing lost
    assert sorted(set(batch.turn_ids[rows0][batch.response_mask[rows0].bool()].tolist())) == [0, 1]
    assert len(batch.turn_obs_keys[row0]) == 2
    assert float(batch.token_rewards.sum()) == pytest.approx(float(batch.turn_rewards[list(first.values())].sum()))
    values = (batch.input_ids % 5).float() / 5
    estimate = advantages if layout == "trajectory" else turn_layout_advantages
    for name in ("gae", "turn_gae", "bilevel_gae", "gigpo", "grpo"):
        adv, _ = estimate(name, batch, values, whiten=False)
        assert torch.isfinite(adv).all() and adv[batch.response_mask.bool()].abs().sum() > 0, name
