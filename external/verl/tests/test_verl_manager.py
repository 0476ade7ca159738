"""ragen's per-turn reward placement under verl's own agent-loop worker, built the way verl builds it (no Ray).

The worker is verl 0.9.1's ``AgentLoopWorker`` constructor (as ``RagenAgentLoopWorker``) on verl's packaged
``ppo_trainer`` config composed with hydra and the override lines of external/verl/README.md (parsed from it, so
the README cannot drift), a saved tiny random model, and ``FakeServerManager`` (test_verl_agent_loop.py) as its
LLM client. Checks: verl's own ``_agent_loop_postprocess`` + the worker's ``_postprocess`` on hand-built
episodes (test_verl_convert.py) and a row of another agent loop; ``generate_sequences`` end to end; verl's GAE
on the resulting ``rm_scores`` against ragen's ``gae``; the manager's registration and its refusal under
verl's v1 trainer; the v1 trainer's worker (``AgentLoopWorkerTQ``) storing ``RagenAgentLoopOutput.as_dict``.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest
import torch

manager = pytest.importorskip(
    "ragen_external.verl.manager",
    reason="verl 0.9.1 is not importable: install it with `bash scripts/setup_verl.sh` (external/verl/README.md)",
    exc_type=ImportError,
)

from ragen_external.verl import AGENT_LOOP_CONFIG, episode_to_agent_loop_output, make_dataset_rows  # noqa: E402
from ragen_external.verl.agent_loop import to_agent_loop_output  # noqa: E402
from test_verl_agent_loop import FakeServerManager  # noqa: E402
from test_verl_convert import hand_batch  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_gae_advantage_return  # noqa: E402

from ragen.algorithms.gae import gae  # noqa: E402

README = Path(manager.__file__).with_name("README.md")
PROMPT_LEN, RESPONSE_LEN = 512, 256  # rollout.prompt_length / response_length: the worker's padding widths


def readme_overrides() -> list[str]:
    """The hydra override lines of the README's "ragen envs in a verl run" command, the config path filled in."""
    text = README.read_text().split("## ragen envs in a verl run")[1].split("```bash")[1].split("```")[0]
    lines = [line.strip().removesuffix("\\").strip() for line in text.splitlines()]
    lines = [line for line in lines if re.match(r"\+?(actor_rollout_ref|trainer)\.[\w.]+=", line)]
    return [re.sub(r"=\$\(python -c .*\)$", "=" + AGENT_LOOP_CONFIG, line) for line in lines]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from verl.trainer import config as verl_config

    with initialize_config_dir(config_dir=str(Path(verl_config.__file__).parent), version_base=None):
        return hydra_compose("ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(config, worker, server): the README's lines + a saved tiny model, verl's worker constructor."""
    from ragen.models import load_tokenizer, tiny_model
    from ragen.rollout.hf import HFEngine

    tokenizer = load_tokenizer()
    model = tiny_model(tokenizer=tokenizer, seed=0)
    path = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    lines = readme_overrides()
    assert len(lines) == 4 and lines[2].startswith("+actor_rollout_ref.rollout.agent.agent_loop_manager_class=")
    config = compose(lines + [f"actor_rollout_ref.model.path={path}", "actor_rollout_ref.rollout.name=vllm",
                              f"actor_rollout_ref.rollout.prompt_length={PROMPT_LEN}",
                              f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}"])
    server = FakeServerManager(HFEngine(model, tokenizer, batch_size=1))
    return config, manager.RagenAgentLoopWorker(config, server), server


def other_loop_output(n_prompt: int, n_response: int, score: float) -> AgentLoopOutput:
    """A row of another agent loop (verl's plain output, no ragen fields). verl's ``_postprocess`` needs the
    same ``reward_extra_info`` keys on every row of a batch, so it reports ragen's (as a mixed batch must)."""
    info = {f"ragen_{k}": 0.0 for k in ("success", "failed", "truncated", "turns")}
    return AgentLoopOutput(
        prompt_ids=list(range(100, 100 + n_prompt)), response_ids=list(range(200, 200 + n_response)),
        response_mask=[1] * n_response, response_logprobs=[-0.5] * n_response, reward_score=score, num_turns=2,
        metrics=AgentLoopMetrics(), extra_fields={"reward_extra_info": info},
    )  # fmt: skip


def postprocessed(worker, outputs):
    """verl's per-row postprocess (padding, masks, positions) of each output, as ``_run_agent_loop`` calls it."""
    async def run():
        return [await worker._agent_loop_postprocess(o, False, raw_prompt=[]) for o in outputs]

    return asyncio.run(run())


def test_postprocess_places_ragen_rewards_per_turn(setup):
    _, worker, _ = setup
    batch = hand_batch()
    outputs = [to_agent_loop_output(episode_to_agent_loop_output(batch, r)) for r in (0, 1)]
    outputs.insert(1, other_loop_output(5, 4, 0.7))
    inputs = postprocessed(worker, outputs)
    ours = worker._postprocess(inputs)
    verls = AgentLoopWorker._postprocess(worker, postprocessed(worker, outputs))

    rm, stock = ours.batch["rm_scores"], verls.batch["rm_scores"]
    want = torch.zeros(3, RESPONSE_LEN)
    want[0, 1], want[0, 6] = 0.5, 1.0  # row a: turns end at response positions 1 and 6 (test_verl_convert.py)
    want[1, 3] = 0.7  # the other loop's row: verl's placement, untouched
    want[2, 3], want[2, 6] = -0.25, 2.0  # row b: turn 0 (reward 0) ends at 0
    assert rm.tolist() == want.tolist()
    assert stock[0, 6] == 1.5 and stock[2, 6] == 1.75 and stock[0].count_nonzero() == 1  # verl: totals at the end
    torch.testing.assert_close(rm.sum(1), torch.tensor([1.5, 0.7, 1.75]))
    assert torch.equal(rm[1], stock[1])
    for key in verls.batch.keys():  # everything else exactly as verl made it
        if key != "rm_scores":
            assert torch.equal(ours.batch[key], verls.batch[key]), key
    assert ours.non_tensor_batch.keys() == verls.non_tensor_batch.keys()
    assert ours.non_tensor_batch["ragen_token_rewards"][1] is None

    # verl's GAE on these rm_scores = ragen's gae on ragen's token rewards (env tokens skipped); on verl's stock
    # rm_scores the earlier turn's returns differ
    mask = ours.batch["response_mask"]
    values = torch.randn(3, RESPONSE_LEN, generator=torch.Generator().manual_seed(0))
    rewards = torch.zeros(3, RESPONSE_LEN)  # ragen's own token_rewards, from the first model token on
    for b, r, start in ((0, 0, 3), (2, 1, 2)):
        rewards[b, : 13 - start] = batch.token_rewards[r, start:]
    rewards[1] = stock[1]
    for gamma, lam in ((1.0, 1.0), (0.9, 0.95)):
        _, ret = gae(rewards, values, mask, gamma=gamma, lam=lam, skip_env_tokens=True)
        _, v_ret = compute_gae_advantage_return(rm, values, mask, gamma, lam)
        _, v_stock = compute_gae_advantage_return(stock, values, mask, gamma, lam)
        m = mask.bool()
        torch.testing.assert_close(v_ret[m], ret[m], rtol=1e-5, atol=1e-5)
        # turn 1 of row a: ragen's return holds only turn 1's 1.0, verl's stock one the whole 1.5
        assert (v_stock[0, 4:7] - ret[0, 4:7]).abs().min() > 0.3


def test_rows_of_other_loops_stay_as_verl_made_them(setup):
    _, worker, _ = setup
    outputs = [other_loop_output(3, 5, 1.25), other_loop_output(6, 2, -1.0)]
    ours = worker._postprocess(postprocessed(worker, outputs))
    verls = AgentLoopWorker._postprocess(worker, postprocessed(worker, outputs))
    for key in verls.batch.keys():
        assert torch.equal(ours.batch[key], verls.batch[key]), key
    assert ours.batch["rm_scores"][0, 4] == 1.25 and ours.batch["rm_scores"][1, 1] == -1.0


def test_a_changed_score_is_refused(setup):
    _, worker, _ = setup
    out = to_agent_loop_output(episode_to_agent_loop_output(hand_batch(), 0))
    out.reward_score = 3.0  # e.g. overwritten after the loop: the per-turn rewards no longer describe it
    with pytest.raises(ValueError, match="row 0: rm_scores sum 3.0"):
        worker._postprocess(postprocessed(worker, [out]))


def test_generate_sequences_through_verls_worker(setup):
    """verl's ``generate_sequences`` (registry from ``agent_loop_config_path``, ``_run_agent_loop``, verl's
    padding) on ``make_dataset_rows`` rows: per-turn ``rm_scores`` on each turn's last model token."""
    _, worker, server = setup
    rows = make_dataset_rows("bandit", [7, 7, 8], agent={"max_turn": 3, "max_new_tokens": 8})
    non_tensors = {k: np.array([r[k] for r in rows], dtype=object) for k in ("data_source", "extra_info")}
    non_tensors["raw_prompt"] = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        non_tensors["raw_prompt"][i] = r["prompt"]
    calls = len(server.calls)
    out = asyncio.run(worker.generate_sequences(DataProto.from_dict(non_tensors=non_tensors)))
    sampled = [c[2].token_ids for c in server.calls[calls:]]
    assert len(sampled) == 9  # 3 rows x 3 turns (the random model never answers in format)
    assert list(out.non_tensor_batch["agent_name"]) == ["ragen"] * 3  # the README's default_agent_loop line
    b = out.batch
    assert b["responses"].shape == b["response_mask"].shape == b["rm_scores"].shape == (3, RESPONSE_LEN)
    pad = worker.tokenizer.pad_token_id
    for i in range(3):
        n = int(b["attention_mask"][i, PROMPT_LEN:].sum())
        tokens = out.non_tensor_batch["ragen_token_rewards"][i]
        positions = out.non_tensor_batch["ragen_reward_positions"][i]
        assert len(tokens) == n and len(positions) == 3
        assert (b["responses"][i, n:] == pad).all() and (b["response_mask"][i, n:] == 0).all()
        assert b["rm_scores"][i, :n].tolist() == pytest.approx(tokens) and (b["rm_scores"][i, n:] == 0).all()
        assert b["rm_scores"][i].nonzero().flatten().tolist() == positions
        assert b["rm_scores"][i, positions].tolist() == pytest.approx([-0.1] * 3)  # the format penalty per turn
        mask = b["response_mask"][i, :n]  # right-padded: model spans (1) and env tokens (0) up to n
        change = (mask[1:] != mask[:-1]).nonzero().flatten().tolist()
        bounds = [0, *(c + 1 for c in change), n]
        spans = [(s, e) for s, e in zip(bounds, bounds[1:], strict=False) if mask[s] == 1]
        assert [e - 1 for _, e in spans] == positions  # rewards on each turn's last model token
        assert all(b["responses"][i, s:e].tolist() in sampled for s, e in spans)  # model spans = sampled ids


def test_manager_swaps_in_the_worker(setup):
    from verl.utils.import_utils import load_class_from_fqn

    config, _, server = setup
    cls = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "AgentLoopManager")
    assert cls is manager.RagenAgentLoopManager
    kwargs = dict(llm_client=server, teacher_client=None, reward_loop_worker_handles=None)  # as verl's trainer
    built = cls(config=config, **kwargs)  # verl's __init__ keeps a subclass's worker class (no Ray until create())
    assert built.agent_loop_workers_class.__ray_actor_class__ is manager.RagenAgentLoopWorker
    v1 = compose(readme_overrides()[:3] + ["actor_rollout_ref.model.path=x", "actor_rollout_ref.rollout.name=vllm"])
    assert v1.trainer.use_v1  # verl 0.9.1's default trainer
    with pytest.raises(ValueError, match="trainer.use_v1=true"):
        cls(config=v1, **kwargs)


def load_v1_worker_module(monkeypatch, stored: list):
    """verl 0.9.1's v1 agent-loop module (``verl/trainer/ppo/v1/agent_loop_tq.py``, loaded from its file: the
    package's ``__init__`` imports the whole v1 trainer) against a fake ``transfer_queue`` (not installed) that
    records what the worker stores."""
    import importlib.util
    import sys
    import types

    import verl

    async def async_kv_put(**kwargs):
        pass

    async def async_kv_batch_put(keys, fields, tags, partition_id):
        stored.append((keys, fields, tags, partition_id))

    fake = types.ModuleType("transfer_queue")
    fake.init, fake.async_kv_put, fake.async_kv_batch_put = lambda *a, **k: None, async_kv_put, async_kv_batch_put
    monkeypatch.setitem(sys.modules, "transfer_queue", fake)
    path = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "agent_loop_tq.py"
    spec = importlib.util.spec_from_file_location("_ragen_test_verl_agent_loop_tq", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_v1_trainer_worker_stores_per_turn_rm_scores(setup, monkeypatch):
    """verl's default (v1) trainer: its worker runs the ragen loop (``_run_agent_loop``) and stores
    ``output.as_dict()`` per trajectory; the stored ``rm_scores`` are ragen's per-turn placement."""
    config, _, server = setup
    stored: list = []
    worker = load_v1_worker_module(monkeypatch, stored).AgentLoopWorkerTQ.__ray_actor_class__(config, server)
    row = make_dataset_rows("bandit", [9], agent={"max_turn": 3, "max_new_tokens": 8})[0]
    trajectory = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    asyncio.run(worker._run_agent_loop(sampling, trajectory, agent_name="ragen", trace=False, session_id=0,
                                       uid="u0", global_steps=1, raw_prompt=row["prompt"],
                                       extra_info=row["extra_info"]))  # fmt: skip
    ((keys, fields, tags, partition),) = stored
    assert keys == ["u0_0_0"] and partition == "train"
    rm, mask = fields["rm_scores"][0], fields["response_mask"][0]
    positions = fields["extra_fields"][0]["ragen_reward_positions"]
    assert len(positions) == 3 and rm.nonzero().flatten().tolist() == positions
    assert rm[positions].tolist() == pytest.approx([-0.1] * 3) and mask[positions].tolist() == [1, 1, 1]
    assert rm.tolist() == pytest.approx(fields["extra_fields"][0]["ragen_token_rewards"])
    assert tags[0]["response_len"] == len(rm)


def test_v1_trainer_path_places_per_turn():
    """verl's v1 trainer stores ``output.as_dict()["rm_scores"]`` per trajectory (``AgentLoopWorkerTQ``)."""
    out = to_agent_loop_output(episode_to_agent_loop_output(hand_batch(), 1))
    assert out.as_dict()["rm_scores"].tolist() == [0, 0, 0, -0.25, 0, 0, 2.0]
    assert AgentLoopOutput.as_dict(out)["rm_scores"].tolist() == [0, 0, 0, 0, 0, 0, 1.75]  # verl's own placement
