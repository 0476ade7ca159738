"""ragen's verl agent loop, run by verl's own ``AgentLoopBase`` machinery against a fake of verl's server manager.

The fake's ``generate`` has the keyword signature of verl 0.9.1's ``LLMServerClient.generate`` and samples with
ragen's ``HFEngine`` over a tiny random model (default tokenizer), recording every call. The checks: the prompt
of each call is the episode prompt plus everything before that turn (append-only context); the response's
mask-1 spans are exactly the sampled ids, in order, with the engine's log-probs; the mask-0 spans are the env
tokens between turns; rewards sit on each turn's last model token.
"""

from __future__ import annotations

import asyncio

import pytest

from ragen.rollout.base import SamplingParams

agent_loop = pytest.importorskip(
    "ragen_external.verl.agent_loop",
    reason="verl 0.9.1 is not importable: install it with `bash scripts/setup_verl.sh` (external/verl/README.md)",
    exc_type=ImportError,
)

MAX_TURN, MAX_NEW = 3, 8


class FakeServerManager:
    """verl's ``LLMServerClient.generate`` over ragen's HF engine; ``calls`` = (prompt_ids, params, TokenOutput)."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        p = sampling_params
        sampling = SamplingParams(
            temperature=p["temperature"], top_p=p["top_p"], top_k=max(0, p["top_k"]), max_new_tokens=p["max_tokens"],
            stop=tuple(p.get("stop", ())), stop_token_ids=tuple(p["stop_token_ids"]), seed=len(self.calls),
        )  # fmt: skip
        sample = self.engine.generate([list(prompt_ids)], sampling)[0]
        out = TokenOutput(token_ids=sample.token_ids, log_probs=sample.log_probs, stop_reason="completed")
        self.calls.append((list(prompt_ids), dict(p), out))
        return out


@pytest.fixture(scope="module")
def tokenizer():
    from ragen.models import load_tokenizer

    return load_tokenizer()


def make_loop(tokenizer, server):
    """The agent loop built the way verl's ``AgentLoopWorker`` builds it: from the registry entry in
    ``agent_loop.yaml`` (``agent_loop_config_path``) with ``hydra.utils.instantiate`` and the same arguments."""
    import hydra
    from omegaconf import OmegaConf
    from ragen_external.verl import AGENT_LOOP_CONFIG
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    (entry,) = [e for e in OmegaConf.load(AGENT_LOOP_CONFIG) if e.name == "ragen"]
    entry = OmegaConf.create({k: v for k, v in entry.items() if k != "name"})
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 512, "response_length": 512}},
                            "data": {}})
    loop = hydra.utils.instantiate(
        config=entry, trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tokenizer,
        processor=None, hf_model_type="llama", dataset_cls=None, data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
    )  # fmt: skip
    assert isinstance(loop, agent_loop.RagenAgentLoop)
    return loop


def loop_eot(tokenizer):
    from ragen.agent import ChatFormat

    return ChatFormat(tokenizer).eot_id


def spans(mask):
    """[(start, end, value)] runs of equal values in ``mask``."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def test_ragen_agent_loop_against_fake_server(tokenizer):
    from ragen_external.verl import make_dataset_rows

    from ragen.models import tiny_model
    from ragen.rollout.hf import HFEngine

    engine = HFEngine(tiny_model(tokenizer=tokenizer, seed=0), tokenizer, batch_size=1)
    server = FakeServerManager(engine)
    loop = make_loop(tokenizer, server)
    row = make_dataset_rows("bandit", [7], agent={"max_turn": MAX_TURN, "max_new_tokens": MAX_NEW})[0]
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out = asyncio.run(loop.run(sampling, raw_prompt=row["prompt"], **row))

    calls = server.calls
    assert len(calls) == MAX_TURN  # the random model never answers in format: every turn is played
    eot = loop_eot(tokenizer)
    for _, p, _ in calls:  # the proxy's budget, stops and log-probs on top of verl's settings
        assert (p["max_tokens"], p["stop_token_ids"], p["stop"]) == (MAX_NEW, [eot], ["</answer>"])
        assert p["include_stop_str_in_output"] and p["logprobs"] and p["temperature"] == 1.0
    assert out.num_turns == 2 * MAX_TURN
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert calls[0][0] == out.prompt_ids  # turn 0's exact prompt

    # mask-1 spans = the sampled ids of each call (the closing end-of-turn token, if ragen appended it, is mask 0)
    model_spans = [(s, e) for s, e, v in spans(out.response_mask) if v == 1]
    assert len(model_spans) == MAX_TURN
    full = out.prompt_ids + out.response_ids
    for k, ((s, e), (prompt, _, sample)) in enumerate(zip(model_spans, calls, strict=True)):
        assert out.response_ids[s:e] == sample.token_ids[: e - s]
        assert e - s == len(sample.token_ids)
        assert out.response_logprobs[s:e] == pytest.approx(sample.log_probs, abs=0)
        # append-only: the prompt of call k is exactly the sequence up to turn k's first model token
        assert prompt == full[: len(out.prompt_ids) + s]
        if k + 1 < MAX_TURN:  # the env tokens after turn k are the next call's prompt suffix, all mask 0
            nxt = model_spans[k + 1][0]
            assert set(out.response_mask[e:nxt]) == {0}
            assert calls[k + 1][0] == full[: len(out.prompt_ids) + nxt]
    assert out.response_mask[-1] == 1  # the response ends on a model token (where verl puts reward_score)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 0)

    # rewards: the format penalty (-0.1) on each turn's last model token
    extra = out.extra_fields
    assert extra["turn_scores"] == pytest.approx([-0.1] * MAX_TURN)
    assert extra["ragen_reward_positions"] == [e - 1 for _, e in model_spans]
    expected = [0.0] * len(out.response_ids)
    for _, e in model_spans:
        expected[e - 1] = -0.1
    assert extra["ragen_token_rewards"] == pytest.approx(expected)
    assert out.reward_score == pytest.approx(-0.1 * MAX_TURN)
    assert extra["reward_extra_info"]["ragen_turns"] == MAX_TURN
    rm = out.as_dict()["rm_scores"]  # what verl's v1 trainer trains on: ragen's placement, not the total at the end
    assert rm.tolist() == pytest.approx(expected)


def test_rows_name_their_env(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ragen_external.verl import EpisodeSpec, make_dataset_rows, spec_from_row

    rows = make_dataset_rows("frozen_lake", [3, 4], env_config={"size": 4}, agent={"max_turn": 2})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")  # what verl's data.train_files read
    back = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert [spec_from_row(r) for r in back] == [EpisodeSpec("frozen_lake", s, {"size": 4}, {"max_turn": 2})
                                                for s in (3, 4)]
    assert back[0]["agent_name"] == "ragen"

    with pytest.raises(ValueError, match="extra_info.ragen_env"):
        spec_from_row({"extra_info": {"ragen_seed": 1}})
    with pytest.raises(ValueError, match="unknown keys \\['max_turns'\\]"):
        agent_loop.agent_config({"max_turns": 3}, 512, 512)
    cfg = agent_loop.agent_config({"max_turn": 2}, 300, 200)
    assert (cfg.max_turn, cfg.max_model_len, cfg.layout) == (2, 500, "trajectory")


def test_rows_run_concurrently_and_a_seed_is_a_group(tokenizer):
    """verl runs a batch's rows as concurrent coroutines on one event loop; rows repeating a seed (``rollout.n``)
    start from the same env state, so their prompts are identical, while other seeds differ."""
    from ragen_external.verl import make_dataset_rows

    from ragen.models import tiny_model
    from ragen.rollout.hf import HFEngine

    server = FakeServerManager(HFEngine(tiny_model(tokenizer=tokenizer, seed=1), tokenizer, batch_size=1))
    loop = make_loop(tokenizer, server)
    rows = make_dataset_rows("frozen_lake", [5, 5, 6], agent={"max_turn": 2, "max_new_tokens": 6})
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def run_all():
        return await asyncio.gather(*(loop.run(sampling, raw_prompt=r["prompt"], **r) for r in rows))

    outs = asyncio.run(run_all())
    assert len(server.calls) == 6 and all(o.num_turns == 4 for o in outs)
    assert outs[0].prompt_ids == outs[1].prompt_ids != outs[2].prompt_ids
    for out in outs:  # each output's model spans are its own samples, in order
        model = [out.response_ids[s:e] for s, e, v in spans(out.response_mask) if v == 1]
        mine = [c[2].token_ids for c in server.calls if c[0][: len(out.prompt_ids)] == out.prompt_ids]
        assert all(any(m == t for t in mine) for m in model)
