"""The program rollout driver (``ragen.agent.program_rollout``) with the hf engine and the tiny model: rows in both
layouts, the episode's reward on its last model token, forks masked in the trajectory layout and split into turn
rows in the turn layout, failed programs failing only their episode, and the gateway's port closed afterwards."""

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
import torch

from ragen.agent.config import AgentConfig
from ragen.agent.program_rollout import ProgramGroups, ProgramProxy
from ragen.models import tiny_model
from ragen.rollout.hf import HFEngine

MODULE = __name__


def chat(base_url, messages, model="ragen"):
    req = urllib.request.Request(base_url + "/chat/completions", method="POST", headers={
        "Content-Type": "application/json"}, data=json.dumps({"model": model, "messages": messages}).encode())
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())["choices"][0]["message"]


def two_calls(base_url, api_key, task, seed):
    """Two calls, the first answer sent back as received (merges); the reward is the task's number."""
    messages = [{"role": "user", "content": f"task {task['n']}"}]
    messages.append(chat(base_url, messages))
    messages.append({"role": "user", "content": "again"})
    chat(base_url, messages)
    if task.get("raise"):
        raise RuntimeError("the program broke")
    return float(task["n"])


def post(base_url, messages):
    req = urllib.request.Request(base_url + "/chat/completions", method="POST", headers={
        "Content-Type": "application/json"}, data=json.dumps({"model": "ragen", "messages": messages}).encode())
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def per_call(base_url, api_key, task, seed):
    """Two merging calls rewarded per call by response id: 0.25 for the first, 2.0 for the second (or a reward
    for an id that is no call of the episode, which fails it)."""
    messages = [{"role": "user", "content": "question"}]
    first = post(base_url, messages)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "again"}]
    second = post(base_url, messages)
    if task == "unknown id":
        return {"chatcmpl-nothing": 1.0}
    return {first["id"]: 0.25, second["id"]: 2.0}


def edited_answer(base_url, api_key, task, seed):
    """Two calls; the first answer is sent back changed (a fork: the model never wrote that text)."""
    messages = [{"role": "user", "content": "question"}]
    chat(base_url, messages)
    messages += [{"role": "assistant", "content": "an answer the model did not write"},
                 {"role": "user", "content": "again"}]
    chat(base_url, messages)
    return 1.0


def wrong_model(base_url, api_key, task, seed):
    try:
        chat(base_url, [{"role": "user", "content": "hi"}], model="gpt-x")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
    return 1.0


HANG = threading.Event()


def hangs(base_url, api_key, task, seed):
    HANG.wait(30)
    return 1.0


@pytest.fixture(scope="module")
def engine(default_tokenizer):
    yield HFEngine(tiny_model(tokenizer=default_tokenizer, seed=0), default_tokenizer, batch_size=8)
    HANG.set()


def proxy(engine, tokenizer, entry, layout="trajectory", n_groups=2, group_size=2, **config):
    agent = AgentConfig(max_new_tokens=6, max_model_len=512, layout=layout)
    groups = ProgramGroups({"entry": f"{MODULE}:{entry}", **config}, n_groups, group_size)
    return ProgramProxy(engine, tokenizer, agent, groups, groups, seed=7)


def model_runs(row_ids, turn_ids):
    """The maximal runs of model tokens of a row: [(start, end)]."""
    runs, start = [], None
    for t, k in enumerate(turn_ids.tolist() + [-1]):
        if k >= 0 and start is None:
            start = t
        if k < 0 and start is not None:
            runs.append((start, t))
            start = None
    return runs


def test_merged_episodes_one_row_reward_on_the_last_model_token(engine, default_tokenizer):
    p = proxy(engine, default_tokenizer, "two_calls", tasks=[{"n": 2}, {"n": 3}])
    batch = p.rollout("train")
    assert batch.batch_size == 4 and batch.failed.tolist() == [False] * 4
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert [ep.seed for ep in batch.episodes] == [7, 7, 8, 8]
    for i in range(4):
        runs = model_runs(batch.input_ids[i], batch.turn_ids[i])
        assert len(runs) == 2  # two calls, both trained, as turns 0 and 1
        assert batch.turn_ids[i, runs[0][0]] == 0 and batch.turn_ids[i, runs[1][0]] == 1
        reward = {7: 3.0, 8: 2.0}[batch.episodes[i].seed]  # seed s plays tasks[s % 2]
        nz = batch.token_rewards[i].nonzero().flatten().tolist()
        assert nz == [runs[1][1] - 1] and batch.token_rewards[i, nz[0]] == reward
        assert batch.turn_rewards[i].tolist() == [0.0, reward]
        # the engine's log-probs on model tokens only
        assert (batch.sample_log_probs[i][batch.response_mask[i] == 0] == 0).all()
        assert (batch.sample_log_probs[i][batch.response_mask[i] == 1] < 0).all()
    assert batch.metrics["gateway/merged_turns"] == 4.0 and batch.metrics["gateway/forks"] == 0.0
    assert batch.metrics["gateway/calls"] == 8.0 and batch.metrics["gateway/failed_episodes"] == 0.0
    assert p.state_dict()["train_calls"] == 1
    with pytest.raises(OSError):  # the gateway stopped with the rollout: nothing listens on its port
        socket.create_connection(("127.0.0.1", p.last_port), timeout=2).close()


def test_per_call_rewards_land_on_each_calls_last_model_token(engine, default_tokenizer):
    batch = proxy(engine, default_tokenizer, "per_call", n_groups=1, group_size=2).rollout("train")
    assert batch.failed.tolist() == [False, False] and batch.metrics["gateway/forks"] == 0.0
    for i in range(2):
        (a0, b0), (a1, b1) = model_runs(batch.input_ids[i], batch.turn_ids[i])
        nz = batch.token_rewards[i].nonzero().flatten().tolist()
        assert nz == [b0 - 1, b1 - 1] and batch.token_rewards[i, nz].tolist() == [0.25, 2.0]
        assert batch.turn_rewards[i].tolist() == [0.25, 2.0]
    assert batch.metrics["env/agent_program/reward"] == 2.25
    bad = proxy(engine, default_tokenizer, "per_call", n_groups=1, group_size=1, tasks=["unknown id"]).rollout("val")
    assert bad.failed.tolist() == [True] and bad.token_rewards.abs().sum() == 0
    assert "'chatcmpl-nothing', which is no response id of its episode" in bad.episodes[0].error


def test_a_raising_program_fails_only_its_episode(engine, default_tokenizer):
    p = proxy(engine, default_tokenizer, "two_calls", n_groups=1, group_size=1, tasks=[{"n": 1, "raise": True}])
    p2 = proxy(engine, default_tokenizer, "two_calls", n_groups=1, group_size=3, tasks=[{"n": 1}])
    ok = p2.rollout("val")
    assert ok.failed.tolist() == [False] * 3 and ok.response_mask.sum() > 0
    bad = p.rollout("val")
    assert bad.failed.tolist() == [True]
    assert bad.response_mask.sum() == 0 and bad.token_rewards.abs().sum() == 0
    assert bad.metrics["gateway/failed_episodes"] == 1.0 and bad.metrics["rollout/env_errors"] == 1.0
    assert "the program broke" in bad.episodes[0].error


def test_timeouts_and_bad_requests_fail_their_episodes(engine, default_tokenizer):
    batch = proxy(engine, default_tokenizer, "hangs", n_groups=1, group_size=2, timeout_s=0.5).rollout("val")
    assert batch.failed.tolist() == [True, True] and "timed out" in batch.episodes[0].error
    batch = proxy(engine, default_tokenizer, "wrong_model", n_groups=1, group_size=2).rollout("val")
    assert batch.failed.tolist() == [True, True] and "unknown model" in batch.episodes[0].error


@pytest.mark.parametrize("layout", ["trajectory", "turn"])
def test_a_forked_episode_is_masked_or_becomes_turn_rows(engine, default_tokenizer, layout):
    batch = proxy(engine, default_tokenizer, "edited_answer", layout, n_groups=1, group_size=2).rollout("train")
    assert batch.metrics["gateway/forks"] == 2.0 and batch.metrics["gateway/forks/prefix_mismatch"] == 2.0
    assert batch.metrics["gateway/merged_turns"] == 0.0
    if layout == "trajectory":
        assert batch.batch_size == 2 and batch.context_cut.tolist() == [True, True]
        assert batch.response_mask.sum() == 0 and batch.token_rewards.abs().sum() == 0
        assert batch.metrics["gateway/masked_episodes"] == 2.0
        return
    assert batch.batch_size == 4 and batch.episode_index.tolist() == [0, 0, 1, 1]
    assert batch.turn_index.tolist() == [0, 1, 0, 1] and not batch.context_cut.any()
    for i in range(4):  # each row is one call: its prompt, then its sample (turn 0, then turn 1)
        (run,) = model_runs(batch.input_ids[i], batch.turn_ids[i])
        assert run[1] == int(batch.attention_mask[i].sum())
        assert set(batch.turn_ids[i, run[0]:run[1]].tolist()) == {i % 2}
    assert torch.equal(batch.token_rewards.sum(dim=1), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert batch.metrics["gateway/masked_episodes"] == 0.0


@pytest.mark.parametrize("entry", ["run", "run_without_tool"])
def test_a_warm_starts_demonstrations_are_the_experts_answers_recorded_through_the_gateway(engine, default_tokenizer,
                                                                                           entry):
    """The calculator's expert answers each call (a tool call, then the tool's result, or with the tool disabled the
    value it computes): every episode is solved, and the model tokens of each row are the expert's texts, each
    followed by the end-of-turn id, after exactly the prompts the program sent."""
    from ragen.gateway.examples import calculator

    name = calculator.__name__
    groups = ProgramGroups({"entry": f"{name}:{entry}", "expert": f"{name}:expert"}, 2, 1)
    p = ProgramProxy(engine, default_tokenizer, AgentConfig(max_new_tokens=64, max_model_len=1024), groups, groups)
    batch = p.rollout("train", responder=p.expert_responder())
    assert batch.failed.tolist() == [False, False] and batch.metrics["gateway/forks"] == 0.0
    assert batch.metrics["env/agent_program/success"] == 1.0 and batch.metrics["env/agent_program/turns"] == 2.0
    eot = p.fmt.eot_id
    for i in range(2):
        task = calculator.make_task(batch.episodes[i].seed)
        (a0, b0), (a1, b1) = model_runs(batch.input_ids[i], batch.turn_ids[i])
        expression = task["question"][len("What is "):-1]
        call = default_tokenizer.decode(batch.input_ids[i, a0:b0 - 1].tolist())
        assert call == f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
        assert default_tokenizer.decode(batch.input_ids[i, a1:b1 - 1].tolist()) == str(task["answer"])
        assert batch.input_ids[i, b0 - 1] == eot and batch.input_ids[i, b1 - 1] == eot
        assert batch.token_rewards[i].nonzero().flatten().tolist() == [b1 - 1]
        shown = default_tokenizer.decode(batch.input_ids[i, b0:a1].tolist())
        assert (str(task["answer"]) in shown) is (entry == "run")  # the tool's result, or its error
    p.groups["train"] = ProgramGroups({"entry": f"{name}:run"}, 1, 1)
    with pytest.raises(ValueError, match="set env.config.expert="):
        p.expert_responder()
