"""LoRA on the policy: merged weights equal the adapted model, adapters-off equals the base (the reference),
only adapters train, checkpoints round-trip, and a sharded (world size 2) LoRA update equals world size 1."""

from __future__ import annotations

import pytest
import torch
from factories import random_train_batch
from transformers import AutoModelForCausalLM
from worker_helpers import make_lm

from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.lora import adapter_state, adapters_disabled, add_lora, is_adapter_key, merge_lora, to_lora_keys

RANK, ALPHA = 4, 8.0


def _lora_lm(seed: int = 0):
    """A tiny LM with adapters whose B is random (non-zero), so merged != base."""
    lm = add_lora(make_lm(seed=seed), RANK, ALPHA)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lm


def _logits(lm, ids):
    with torch.no_grad():
        return lm(input_ids=ids).logits


def test_only_adapters_train_and_init_is_the_base():
    base = make_lm(seed=0)
    lm = add_lora(make_lm(seed=0), RANK, ALPHA)
    trainable = [n for n, p in lm.named_parameters() if p.requires_grad]
    assert trainable and all(is_adapter_key(n) for n in trainable)
    assert len(trainable) == 2 * 7 * 2  # A and B of 7 linears in each of 2 layers
    ids = torch.randint(3, 1000, (2, 10), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(lm, ids), _logits(base, ids), atol=0, rtol=0)  # B = 0 at init


def test_merged_weights_equal_the_adapted_model_and_disabled_equals_base():
    lm = _lora_lm()
    ids = torch.randint(3, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
    merged = merge_lora(lm.state_dict(), ALPHA / RANK)
    plain = make_lm(seed=5)
    assert set(merged) == set(plain.state_dict())  # transformers names, no adapter or base_layer keys
    plain.load_state_dict(merged)
    adapted = _logits(lm, ids)
    torch.testing.assert_close(_logits(plain, ids), adapted, atol=1e-5, rtol=1e-5)
    with adapters_disabled(lm):
        torch.testing.assert_close(_logits(lm, ids), _logits(make_lm(seed=0), ids), atol=0, rtol=0)
    torch.testing.assert_close(_logits(lm, ids), adapted, atol=0, rtol=0)  # back on after the block
    assert (adapted - _logits(make_lm(seed=0), ids)).abs().max() > 1e-3  # the adapters do change the output


def test_merge_by_hand_and_unmerge_round_trip():
    W, A, B = torch.ones(2, 3), torch.tensor([[1.0, 0.0, 2.0]]), torch.tensor([[1.0], [-1.0]])
    state = {"m.base_layer.weight": W, "m.lora_A.default.weight": A, "m.lora_B.default.weight": B,
             "m.base_layer.bias": torch.zeros(2), "n.weight": torch.zeros(1)}
    out = merge_lora(state, 0.5)
    torch.testing.assert_close(out["m.weight"], torch.tensor([[1.5, 1.0, 2.0], [0.5, 1.0, 0.0]]))
    assert set(out) == {"m.weight", "m.bias", "n.weight"}
    back = merge_lora({**to_lora_keys(out, list(state)), **adapter_state(state)}, -0.5)
    torch.testing.assert_close(back["m.weight"], W)


def _actor(model_dir, **cfg) -> LocalWorkerGroup:
    base = {"lr": 1e-2, "mini_batch_size": 8, "micro_batch_size": 4, "mixed_precision": "fp32",
            "lora_rank": RANK, "lora_alpha": ALPHA}
    return LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=ActorConfig(**{**base, **cfg}))


def _batch(plain: LocalWorkerGroup) -> TrainBatch:
    b = random_train_batch(8, 24, seed=11, draw=("advantages",))
    return b.with_fields(old_log_probs=plain.call("compute_log_probs", b))


def test_lora_actor_update_reference_and_checkpoint(model_dir, tmp_path):
    plain = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir,
                             cfg=ActorConfig(mini_batch_size=8, micro_batch_size=8, mixed_precision="fp32"))
    batch = _batch(plain)
    g = _actor(model_dir)
    worker = g.worker
    assert worker.trainable.optimizer.param_groups[0]["lr"] == 1e-2  # the adapters train at actor.lr
    torch.testing.assert_close(g.call("compute_log_probs", batch), batch.old_log_probs, atol=1e-6, rtol=1e-6)
    before = g.call_rank0("full_state_dict")
    for _ in range(3):
        m = g.call("update", batch)
    assert m["actor/grad_norm"] > 0
    after = g.call_rank0("full_state_dict")
    assert set(after) == set(before)  # merged weights under transformers names (what the engine receives)
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-3
    # the base stays frozen: adapters off = the untouched model = the reference policy
    ref = g.call("compute_ref_log_probs", batch)
    torch.testing.assert_close(ref, batch.old_log_probs, atol=1e-6, rtol=1e-6)
    new = g.call("compute_log_probs", batch)
    gain = ((new - batch.old_log_probs) * batch.advantages)[batch.response_mask.bool()].sum()
    assert gain > 0  # the update followed the advantages
    frozen = {k: v for k, v in worker.module.state_dict().items() if "base_layer" in k}
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    for k, v in frozen.items():
        torch.testing.assert_close(v, initial[k[len("lm."):].replace(".base_layer", "")], atol=0, rtol=0)
    # checkpoint: merged weights load with from_pretrained; a LoRA actor resumes base + adapters
    g.call("save", dir=str(tmp_path / "ck"))
    assert (tmp_path / "ck" / "lora" / "adapter.safetensors").is_file()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").state_dict()
    assert max(float((hf[k] - after[k]).abs().max()) for k in after) == 0.0
    resumed = _actor(model_dir)
    resumed.call("load", dir=str(tmp_path / "ck"))
    torch.testing.assert_close(resumed.call("compute_log_probs", batch), new, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(resumed.call("compute_ref_log_probs", batch), ref, atol=1e-5, rtol=1e-5)
    m1, m2 = g.call("update", batch), resumed.call("update", batch)  # optimizer moments restored too
    assert m2["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], rel=1e-4, abs=1e-6)


def test_plain_actor_has_no_lora_reference(model_dir):
    g = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=ActorConfig(mixed_precision="fp32"))
    with pytest.raises(RuntimeError, match="lora_rank"):
        g.call("compute_ref_log_probs", random_train_batch(2, 8))


@pytest.mark.parametrize("kwargs, match", [({"lora_rank": -1}, "lora_rank=-1"),
                                           ({"lora_rank": 4, "lora_alpha": 0.0}, "lora_alpha > 0"),
                                           ({"lora_rank": 4, "lora_target_modules": []}, "lora_target_modules")])
def test_lora_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActorConfig(**kwargs)


def test_unknown_target_module_is_named(model_dir):
    with pytest.raises(ValueError, match="qkv_proj"):
        add_lora(make_lm(), RANK, ALPHA, ["qkv_proj"])


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "fsdp2"])
def test_merge_adapters_folds_them_into_the_reference(model_dir, sharded):
    """After updates, ``merge_adapters`` leaves the policy as it was, makes the adapters-off reference equal to it
    and starts the adapters again from their initial values (A from the seed, B = 0), under FSDP2 too."""
    import contextlib

    from worker_helpers import sharded_world_of_one

    plain = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir,
                             cfg=ActorConfig(mini_batch_size=8, micro_batch_size=8, mixed_precision="fp32"))
    batch = _batch(plain)
    with sharded_world_of_one("cpu") if sharded else contextlib.nullcontext():
        g = _actor(model_dir)
        initial = {k: v.clone() for k, v in g.worker._initial_adapters.items()}
        for _ in range(3):
            g.call("update", batch)
        before = g.call("compute_log_probs", batch)
        assert (before - g.call("compute_ref_log_probs", batch)).abs().max() > 1e-3  # the adapters moved it
        g.call("merge_adapters")
        after, ref = g.call("compute_log_probs", batch), g.call("compute_ref_log_probs", batch)
        torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
        assert torch.equal(ref, after)  # B = 0: the adapters add exactly nothing
        state = g.worker.module.state_dict()
        for name, value in initial.items():
            param = state[f"lm.{name}"]
            param = param.full_tensor() if hasattr(param, "full_tensor") else param
            assert torch.equal(param, value), name
