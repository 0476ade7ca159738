"""World size 2 (Ray actors, FSDP2 over gloo) equals world size 1 (in-process, unsharded) for the ArCHer critic
(inference, one update of two mini-batches with its Polyak target steps, checkpoints; the world-size-2 critic runs
in micro-batches of one turn, so its ranks' passes must pair up) and the ArCHer policy's token-level REINFORCE
update."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ragen.archer.critic import ArcherCriticWorker, CriticSettings
from ragen.archer.transitions import policy_batch
from ragen.archer.workers import ArcherPolicyWorker
from ragen.workers import ActorConfig, LocalWorkerGroup, WorkerGroup

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

STATES = ["Is it an animal? no.", "Is it alive? yes. Is it a plant? no.", "Is it red?", "Guess: cat. wrong.",
          "Is it bigger than a car? yes.", "Is it a tool?", "Is it metal? yes. Is it sharp? no.", "Start."]
ACTIONS = ["Is it a fish?", "Is it a tree?", "Is it an apple?", "Is it a dog?", "Is it a whale?", "Is it a hammer?",
           "Is it a spoon?", "Is it an animal?"]
UPDATE = {"states": STATES, "actions": ACTIONS, "rewards": [-1.0, 0.0, -1.0, 1.0, -1.0, 0.0, -1.0, -1.0],
          "next_states": [s + " more" for s in STATES], "dones": [False, True, False, True, False, False, True, False],
          "pi_actions": list(reversed(ACTIONS))}


def _close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-4, msg=k)


def _moved(after: dict, before: dict) -> float:
    return max(float((after[k] - before[k]).abs().max()) for k in before)


@pytest.mark.slow
def test_critic_world_size_2_equals_1(ray_cluster, tmp_path):
    cfg = CriticSettings(encoder="tiny", hidden=16, lr=1e-2, batch_size=4, tau=0.5, seed=3)
    one = LocalWorkerGroup(ArcherCriticWorker, cfg=cfg)
    two = WorkerGroup(ArcherCriticWorker, 2, resources_per_worker={"CPU": 1},
                      cfg=dataclasses.replace(cfg, micro_batch_size=1))
    try:
        init = one.call_rank0("full_state_dict")
        _close(two.call_rank0("full_state_dict")["online"], init["online"], atol=0)
        # inference: 5 rows are split 3 + 2 and come back in row order (3 passes of 1 row on both ranks, rank 1's
        # last without a row of its own); 1 row leaves rank 1 without rows
        kw5 = {"states": STATES[:5], "actions": ACTIONS[:5]}
        torch.testing.assert_close(two.call("scores", **kw5), one.call("scores", **kw5), atol=1e-6, rtol=1e-5)
        kw1 = {"states": STATES[:1], "actions": ACTIONS[:1]}
        torch.testing.assert_close(two.call("target_min_q", **kw1), one.call("target_min_q", **kw1))
        # one update = two mini-batches of 4 rows (2 per rank, in 2 passes), each followed by a Polyak step
        m1, m2 = one.call("update", **UPDATE), two.call("update", **UPDATE)
        for k in ("critic/loss", "critic/q_loss", "critic/v_loss", "critic/grad_norm", "critic/target_q_mean"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
        s1, s2 = one.call_rank0("full_state_dict"), two.call_rank0("full_state_dict")
        assert _moved(s1["online"], init["online"]) > 1e-3 and _moved(s1["target"], init["target"]) > 1e-3
        _close(s2["online"], s1["online"], atol=2e-5)
        _close(s2["target"], s1["target"], atol=2e-5)
        # a checkpoint of the sharded group loads into the unsharded one (weights, target, optimizer state)
        two.call("save", dir=str(tmp_path / "c2"))
        fresh = LocalWorkerGroup(ArcherCriticWorker, cfg=cfg)
        fresh.call("load", dir=str(tmp_path / "c2"))
        _close(fresh.call_rank0("full_state_dict")["online"], s2["online"], atol=0)
        m1, m2 = one.call("update", **UPDATE), fresh.call("update", **UPDATE)
        assert m2["critic/loss"] == pytest.approx(m1["critic/loss"], rel=1e-4, abs=1e-6)
        _close(fresh.call_rank0("full_state_dict")["online"], one.call_rank0("full_state_dict")["online"], atol=2e-5)
    finally:
        two.shutdown()


@pytest.mark.slow
def test_policy_reinforce_update_world_size_2_equals_1(ray_cluster):
    from ragen.trainer.builders import prepare_model
    from ragen.trainer.config.compose import load_train_config

    path, _ = prepare_model(load_train_config("base", ["model=tiny"]))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 900, (int(n),), generator=g).tolist() for n in torch.randint(3, 9, (8,), generator=g)]
    actions = [torch.randint(5, 900, (int(n),), generator=g).tolist() for n in torch.randint(1, 6, (8,), generator=g)]
    batch = policy_batch(prompts, actions, pad_id=0, advantages=torch.randn(8, generator=g))
    acfg = ActorConfig(lr=1e-3, mini_batch_size=4, micro_batch_size=1, mixed_precision="fp32")
    one = LocalWorkerGroup(ArcherPolicyWorker, model_name_or_path=path, cfg=acfg)
    two = WorkerGroup(ArcherPolicyWorker, 2, resources_per_worker={"CPU": 1}, model_name_or_path=path, cfg=acfg)
    try:
        init = one.call_rank0("full_state_dict")
        m1, m2 = one.call("reinforce_update", batch), two.call("reinforce_update", batch)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/log_prob"):
            assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
        s1 = one.call_rank0("full_state_dict")
        assert _moved(s1, init) > 1e-4
        _close(two.call_rank0("full_state_dict"), s1, atol=2e-5)
    finally:
        two.shutdown()
