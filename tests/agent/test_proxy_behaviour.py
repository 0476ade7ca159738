"""Proxy behaviour with a scripted engine: multi-action, failures, context limits, seeds, resume."""

from __future__ import annotations

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec, collate


def fixed(tok, text: str, end: bool = True):
    """Script that always answers ``text`` (+ the end-of-turn token)."""
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.convert_tokens_to_ids("<|end|>")] if end else [])
    return lambda call, i, prompt: ids


def test_multi_action_sums_rewards_and_stops_at_done(char_tok, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right || bogus || right || right || right</answer>"))
    cfg = AgentConfig(max_turn=2, max_actions_per_turn=2, think=False)
    specs = [
        EnvGroupSpec("test_line", {"rewards": (1.0, 0.5, 2.0), "horizon": 3}, n_groups=1, group_size=1),
        EnvGroupSpec("test_line", {"rewards": (1.0, 0.5, 2.0), "horizon": 3}, 1, 1, max_actions_per_turn=5),
    ]
    batch = AgentProxy(engine, char_tok, cfg, specs, []).rollout()
    # env 0: first 2 actions per turn -> turn 0: right(1.0) + bogus(0, invalid); turn 1: right(0.5) + bogus.
    # env 1: 5 actions -> right, bogus, right, right = 1.0 + 0 + 0.5 + 2.0 -> done: the 5th is not executed.
    assert batch.turn_rewards.tolist() == [[1.0, 0.5], [3.5, 0.0]]
    assert batch.num_turns.tolist() == [2, 1]
    assert batch.episodes[0].turns[0].actions == ["right", "bogus"]
    assert batch.episodes[1].turns[0].actions == ["right", "bogus", "right", "right", "right"]
    assert batch.turn_obs_keys == [["pos=0", "pos=1"], ["pos=0"]]
    assert batch.truncated.tolist() == [False, False]  # max_turn is a true end, not a length-budget cut
    assert batch.metrics["env/test_line/valid_action_ratio"] == pytest.approx((2 / 4 + 3 / 4) / 2)
    assert batch.metrics["env/test_line/success"] == 0.5
    assert batch.group_ids.tolist() == [0, 1]
    assert len(engine.calls[1][0]) == 1  # the finished env is not generated for


def test_format_penalty_and_no_step(char_tok, fake_engine):
    engine = fake_engine(fixed(char_tok, "I go right"))
    cfg = AgentConfig(max_turn=2, format_penalty=-0.25)
    batch = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {}, 1, 1)], []).rollout()
    assert batch.turn_rewards.tolist() == [[-0.25, -0.25]]
    assert batch.turn_obs_keys == [["pos=0", "pos=0"]]  # no env step happened
    assert batch.metrics["env/test_line/format_ok"] == 0.0
    assert batch.metrics["env/test_line/valid_action_ratio"] == 0.0
    assert batch.episodes[0].turns[1].prompt_text.startswith("Your previous answer could not be parsed")


def test_length_cutoff_appends_end_token_as_env_token(char_tok, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right</answer> and more text", end=False))
    cfg = AgentConfig(max_turn=1, think=False, max_new_tokens=22, max_model_len=4096)
    batch = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {}, 1, 1)], []).rollout()
    n = int(batch.attention_mask[0].sum())
    eot = char_tok.convert_tokens_to_ids("<|end|>")
    assert int(batch.input_ids[0, n - 1]) == eot and int(batch.response_mask[0, n - 1]) == 0
    assert int(batch.response_mask[0].sum()) == 22
    assert float(batch.token_rewards[0, n - 2]) == 1.0  # the last MODEL token carries the reward
    assert batch.metrics["agent/length_cutoffs"] == 1.0


@pytest.mark.parametrize("where", ["reset", "step"])
def test_env_exception_is_isolated(char_tok, where, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right</answer>"))
    cfg = AgentConfig(max_turn=3, think=False)
    spec = EnvGroupSpec("test_line", {"fail_on": where}, n_groups=2, group_size=2)
    proxy = AgentProxy(engine, char_tok, cfg, [spec], [], seed=0)  # group seeds 0 and 1: group 1 (odd) fails
    batch = proxy.rollout()
    failed = [e.failed for e in batch.episodes]
    assert failed == [False, False, True, True]
    assert all(f"boom in {where}" in e.error for e in batch.episodes[2:])
    assert batch.metrics["env/test_line/failed"] == 2.0
    assert batch.failed.tolist() == failed
    assert batch.turn_rewards[:2].tolist() == [[1.0, 0.0, 2.0]] * 2  # the healthy group is unaffected
    assert batch.response_mask[2:].sum() == 0 and batch.token_rewards[2:].abs().sum() == 0
    assert (batch.turn_ids[2:] == -1).all() and batch.attention_mask[2:].sum(1).min() >= 1
    assert [len(c[0]) for c in engine.calls] == ([2, 2, 2] if where == "reset" else [4, 2, 2])
    # the next rollout rebuilds the failed envs (new seeds 2, 3: group 1 fails again, group 0 is fine)
    assert [e.failed for e in proxy.rollout().episodes] == [False, False, True, True]


def test_context_window_keeps_last_turns(char_tok, monkeypatch, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right</answer>"))
    cfg = AgentConfig(max_turn=3, think=False, max_context_window=1)
    spec = EnvGroupSpec("test_line", {"horizon": 5}, 1, 1)
    monkeypatch.setitem(collate._state, "warned_context_cut", False)
    with pytest.warns(UserWarning, match="agent.layout=turn"):
        batch = AgentProxy(engine, char_tok, cfg, [spec], []).rollout()
    p2 = char_tok.decode(engine.calls[2][0][0])
    assert "pos=1" in p2 and "pos=2" in p2 and "pos=0" not in p2  # turn 0 dropped, turn 1 kept
    assert p2.count("<answer>right</answer>") == 1
    assert batch.metrics["agent/context_truncations"] == 0.0  # the window is not a truncation
    assert bool(batch.context_cut[0]) and batch.metrics["rollout/context_cut_ratio"] == 1.0
    n = int(batch.attention_mask[0].sum())  # the trajectory row still holds all three turns...
    assert char_tok.decode(batch.input_ids[0, :n].tolist()).count("<answer>right</answer>") == 3
    assert int(batch.response_mask[0].sum()) == 0  # ...but trains none: turn 2 saw a different context


def test_max_model_len_drops_history_and_counts_it(char_tok, monkeypatch, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right</answer>"))
    spec = EnvGroupSpec("test_line", {"horizon": 5}, 1, 1)
    full = AgentProxy(fake_engine(fixed(char_tok, "<answer>right</answer>")), char_tok,
                      AgentConfig(max_turn=3, think=False), [spec], [])  # fmt: skip
    full.rollout()
    lengths = [len(c[0][0]) for c in full.engine.calls]
    limit = lengths[2] + 10  # turn 2's full prompt + 32 new tokens does not fit; turn 1's does
    cfg = AgentConfig(max_turn=3, think=False, max_model_len=limit, max_new_tokens=32)
    monkeypatch.setitem(collate._state, "warned_context_cut", False)
    with pytest.warns(UserWarning, match="agent.layout=turn"):  # the cut trajectory row is masked out
        batch = AgentProxy(engine, char_tok, cfg, [spec], []).rollout()
    assert lengths[1] + 32 <= limit
    assert [len(c[0][0]) for c in engine.calls][:2] == lengths[:2]
    assert len(engine.calls[2][0][0]) + 32 <= limit
    assert batch.metrics["agent/context_truncations"] == 1.0
    assert batch.num_turns.tolist() == [3]


def test_prompt_that_never_fits_ends_episode_as_truncated(char_tok, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right</answer>"))
    cfg = AgentConfig(max_turn=3, think=False, max_model_len=100, max_new_tokens=8)
    batch = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {}, 1, 1)], []).rollout()
    assert engine.calls == [] and batch.num_turns.tolist() == [0]
    assert batch.truncated.tolist() == [True] and batch.metrics["agent/prompt_overflow"] == 1.0


@pytest.mark.parametrize("window", [None, 0])
def test_history_free_prompt_that_no_longer_fits_ends_episode_as_truncated(char_tok, window, fake_engine):
    """At turn k >= 1, when not even the history-free prompt leaves room for a response, the episode ends as
    truncated (``agent/prompt_overflow``); the turns already generated keep training."""
    script = fixed(char_tok, "no tags")  # malformed: turn 1's message adds "could not be parsed", so it is longer
    probe = fake_engine(script)
    AgentProxy(probe, char_tok, AgentConfig(max_turn=1), [EnvGroupSpec("test_line", {}, 1, 1)], []).rollout()
    first = len(probe.calls[0][0][0])
    engine = fake_engine(script)
    cfg = AgentConfig(max_turn=3, max_model_len=first + 8, max_new_tokens=8, max_context_window=window)
    batch = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {}, 1, 1)], []).rollout()
    assert len(engine.calls) == 1 and batch.num_turns.tolist() == [1]
    assert batch.truncated.tolist() == [True] and batch.metrics["agent/prompt_overflow"] == 1.0
    assert batch.metrics["agent/context_truncations"] == (1.0 if window is None else 0.0)
    assert not batch.context_cut.any() and int(batch.response_mask.sum()) == 8


def test_seeds_advance_in_train_fixed_in_val_and_resume(char_tok, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right</answer>"))
    cfg = AgentConfig(max_turn=1, think=False)
    train = [EnvGroupSpec("test_line", {}, n_groups=2, group_size=3)]
    val = [EnvGroupSpec("test_line", {}, n_groups=1, group_size=2)]
    proxy = AgentProxy(engine, char_tok, cfg, train, val, seed=7, val_seed=500)
    seeds = [[e.seed for e in proxy.rollout("train").episodes] for _ in range(2)]
    assert seeds == [[7, 7, 7, 8, 8, 8], [9, 9, 9, 10, 10, 10]]
    assert [e.seed for e in proxy.rollout("val").episodes] == [500, 500]
    assert [e.seed for e in proxy.rollout("val").episodes] == [500, 500]
    state = proxy.state_dict()
    nxt = [e.seed for e in proxy.rollout("train").episodes]
    other = AgentProxy(engine, char_tok, cfg, train, val, seed=0)
    other.load_state_dict(state)
    assert [e.seed for e in other.rollout("train").episodes] == nxt == [11, 11, 11, 12, 12, 12]
    with pytest.raises(ValueError, match="valid modes"):
        AgentProxy(engine, char_tok, cfg, train, []).rollout("val")


def test_step_and_outcome_rewards_are_collected(char_tok, fake_engine):
    engine = fake_engine(fixed(char_tok, "<answer>right</answer>"))
    cfg = AgentConfig(max_turn=3, think=False)
    spec = EnvGroupSpec("test_line", {"split": True}, 1, 1)
    batch = AgentProxy(engine, char_tok, cfg, [spec], []).rollout()
    assert batch.step_rewards.tolist() == [[1.0, 0.0, 2.0]]
    assert batch.outcome_rewards.tolist() == [10.0]
    assert torch.equal(batch.token_rewards.sum(1), batch.turn_rewards.sum(1))
    assert batch.tool_results.tolist() == [[False, False, False]]  # the env sets no tool_result: none


@pytest.mark.parametrize("layout", ["trajectory", "turn"])
def test_tool_result_flags_come_from_the_env_not_the_step_reward(char_tok, fake_engine, layout):
    """The env's ``tool_result`` of each turn reaches the batch as it is: here the tool turn is the one with step
    reward 0, and the turns with step rewards 1 and 2 received no tool result."""
    engine = fake_engine(fixed(char_tok, "<answer>right</answer>"))
    cfg = AgentConfig(max_turn=3, think=False, layout=layout, max_context_window=1 if layout == "turn" else None)
    spec = EnvGroupSpec("test_line", {"split": True, "tools": (False, True, False)}, 1, 2)
    batch = AgentProxy(engine, char_tok, cfg, [spec], []).rollout()
    assert batch.step_rewards.tolist() == [[1.0, 0.0, 2.0]] * batch.batch_size
    assert batch.tool_results.dtype == torch.bool
    assert batch.tool_results.tolist() == [[False, True, False]] * batch.batch_size
    assert batch.select([1]).tool_results.tolist() == [[False, True, False]]


def test_format_penalty_is_part_of_the_step_reward(char_tok, fake_engine):
    """MS-GRPO normalises step rewards R^T and outcomes R^O apart: a malformed turn's penalty must reach R^T, or
    the turn-credit estimators never see it (measured: format collapse on delayed_choice)."""
    good = char_tok("<answer>right</answer><|end|>", add_special_tokens=False)["input_ids"]
    bad = char_tok("no tags<|end|>", add_special_tokens=False)["input_ids"]
    engine = fake_engine(lambda call, i, prompt: bad if call == 1 else good)
    cfg = AgentConfig(max_turn=3, think=False, format_penalty=-0.25)
    spec = EnvGroupSpec("test_line", {"split": True}, 1, 1)
    batch = AgentProxy(engine, char_tok, cfg, [spec], []).rollout()
    assert batch.turn_rewards.tolist() == [[1.0, -0.25, 0.0]]  # turn 2 is the env's second step (reward 0.0)
    assert batch.step_rewards.tolist() == [[1.0, -0.25, 0.0]]
    assert batch.outcome_rewards.tolist() == [0.0]  # 2 env steps of a horizon of 3: not done
    assert batch.episodes[0].turns[1].step_reward == 0.0  # the record keeps the env's own figure


@pytest.mark.parametrize("stop_at_answer", [True, False])
def test_generation_stops_at_the_closing_answer_tag(char_tok, fake_engine, stop_at_answer):
    """With stop_at_answer the response ends with the token completing </answer>: that token is the turn's last
    model token and carries the reward, the end-of-turn token appended after it has response mask 0, and the
    text the model would have written after its action is never sampled."""
    text = "<answer>right</answer> and then I ramble"
    script = char_tok(text + "<|end|>", add_special_tokens=False)["input_ids"]
    engine = fake_engine(lambda call, i, prompt: script, decode=char_tok.decode)
    cfg = AgentConfig(max_turn=1, think=False, stop_at_answer=stop_at_answer)
    batch = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {}, 1, 1)], []).rollout()
    assert engine.calls[0][1].stop == (("</answer>",) if stop_at_answer else ())
    row, mask = batch.input_ids[0].tolist(), batch.response_mask[0].tolist()
    model_text = char_tok.decode([t for t, m in zip(row, mask, strict=True) if m])
    last = max(i for i, m in enumerate(mask) if m)
    eot = char_tok.convert_tokens_to_ids("<|end|>")
    assert row[last + 1] == eot and mask[last + 1] == 0 if stop_at_answer else row[last] == eot
    assert model_text == ("<answer>right</answer>" if stop_at_answer else text + "<|end|>")
    reward = 1.0 if stop_at_answer else -0.1  # the parser rejects text after </answer>: a format penalty
    assert batch.token_rewards[0, last].item() == pytest.approx(reward)
    assert batch.token_rewards[0].sum().item() == pytest.approx(reward)
    assert batch.episodes[0].turns[0].format_ok is stop_at_answer and batch.metrics["agent/length_cutoffs"] == 0.0


def test_reminder_first_turn_states_the_format_once_and_after_an_unparsed_answer(char_tok, fake_engine):
    script = {0: "<answer>right</answer>", 1: "no tags", 2: "<answer>right</answer>", 3: "<answer>right</answer>"}
    end = [char_tok.convert_tokens_to_ids("<|end|>")]
    rows, prompts = {}, {}
    for reminder in ("every_turn", "first_turn"):
        engine = fake_engine(lambda call, i, p: char_tok(script[call], add_special_tokens=False)["input_ids"] + end)
        cfg = AgentConfig(max_turn=4, think=False, reminder=reminder)
        batch = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {"horizon": 9}, 1, 1)], []).rollout()
        prompts[reminder] = [t.prompt_text for t in batch.episodes[0].turns]
        rows[reminder] = int(batch.attention_mask[0].sum())
    full = "You have {n} action(s) left ({n} turn(s), at most 1 action(s) per turn).\nAlways respond in the format " \
           "<answer>action</answer>."
    every, first = prompts["every_turn"], prompts["first_turn"]
    assert first[0] == every[0] and every[0].endswith(full.format(n=4))
    assert every[1].endswith(full.format(n=3)) and every[3].endswith(full.format(n=1))
    assert first[1] == "Turn 2. State:\npos=1\nLegal actions: left, right\n3 action(s) left."
    assert first[3] == "Turn 4. State:\npos=2\nLegal actions: left, right\n1 action(s) left."
    # turn 3 follows the unparsed turn 2: the reminder comes back with the note
    assert first[2] == every[2] and first[2].startswith("Your previous answer could not be parsed")
    assert first[2].endswith(full.format(n=2))
    n_tok = lambda text: len(char_tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    saved = sum(n_tok(full.format(n=n)) - n_tok(f"{n} action(s) left.") for n in (3, 1))
    assert rows["every_turn"] - rows["first_turn"] == saved > 0  # the row holds exactly the shorter messages
    with pytest.raises(ValueError, match="reminder must be one of"):
        AgentConfig(reminder="never")


def test_bad_config_and_bad_template_errors(char_tok):
    with pytest.raises(ValueError, match="layout"):
        AgentConfig(layout="steps")
    with pytest.raises(ValueError, match="unknown config key"):
        AgentProxy(None, char_tok, AgentConfig(), [EnvGroupSpec("test_line", {"nope": 1}, 1, 1)], [])
    with pytest.raises(ValueError, match="n_groups"):
        EnvGroupSpec("test_line", {}, 0, 1)


def test_response_prefix_is_a_prompt_token_and_parsed_with_the_response(char_tok, fake_engine):
    engine = fake_engine(fixed(char_tok, "right</answer>"))
    cfg = AgentConfig(max_turn=2, think=False, response_prefix="<answer>")
    batch = AgentProxy(engine, char_tok, cfg, [EnvGroupSpec("test_line", {"rewards": (1.0, 2.0)}, 1, 1)], []).rollout()
    assert batch.turn_rewards.tolist() == [[1.0, 2.0]]  # both turns parsed: prefix + response is well-formed
    prefix = char_tok("<answer>", add_special_tokens=False)["input_ids"]
    for prompt, _ in engine.calls:  # every turn's prompt ends with the forced prefix
        assert prompt[0][-len(prefix) :] == prefix
    row, mask = batch.input_ids[0].tolist(), batch.response_mask[0].tolist()
    first_model = mask.index(1)
    assert row[first_model - len(prefix) : first_model] == prefix
    assert sum(mask[first_model - len(prefix) : first_model]) == 0  # the prefix is not trained on
    assert batch.episodes[0].turns[0].response_text == "<answer>right</answer>"


def test_engine_aborted_rows_are_dropped_and_counted(char_tok, fake_engine):
    """vLLM's abort / error rows hold no sample: the episode fails (trains nothing), the rest go on; a repetition
    stop is a real, kept sample, counted apart."""
    from ragen.rollout.base import Sample

    inner = fake_engine(fixed(char_tok, "<answer>right</answer>"))

    class Marking:
        def __init__(self):
            self.calls = inner.calls

        def generate(self, prompts, sampling):
            out = inner.generate(prompts, sampling)
            if len(self.calls) == 1:  # first turn: row 1 aborted, row 2 errored, row 3 ended by repetition
                out[1] = Sample([], [], "abort")
                out[2] = Sample(out[2].token_ids[:3], out[2].log_probs[:3], "error")
                out[3] = Sample(out[3].token_ids, out[3].log_probs, "repetition")
            return out

    cfg = AgentConfig(max_turn=2, think=False)
    spec = EnvGroupSpec("test_line", {}, n_groups=1, group_size=4)
    batch = AgentProxy(Marking(), char_tok, cfg, [spec], []).rollout()
    assert [e.failed for e in batch.episodes] == [False, True, True, False]
    assert "engine finished the request: abort" in batch.episodes[1].error
    assert batch.metrics["agent/engine_dropped"] == 2.0 and batch.metrics["agent/repetition_stops"] == 1.0
    assert batch.response_mask[1:3].sum() == 0 and batch.response_mask[[0, 3]].sum(1).min() > 0
    assert [len(c[0]) for c in inner.calls] == [4, 2]  # the dropped episodes take no second turn
