"""GPU twins of the worker checks (``device`` fixture: ``cpu`` every run, ``cuda`` under the ``gpu`` marker).

* An FSDP2 update under a one-rank process group (NCCL on CUDA, gloo on CPU) equals the plain update on CPU in
  fp32, and in bf16 stays within stated bounds of it.
* Log-probs and critic values computed on the device equal a float64 reference computed on CPU.

Tolerances (fp32 wherever equality is claimed): log-probs within 1e-4 absolute of the float64 reference (|log p| is
~7 for a vocab of 1000, fp32 rounds at ~1e-7 relative per operation); weights after two AdamW steps at lr 1e-3 within
1e-4 absolute (a tenth of one step's size), metrics within 1e-4 relative. bf16 bounds are stated at the test.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from factories import random_train_batch
from transformers import AutoModel, AutoModelForCausalLM
from worker_helpers import make_lm, placed_on, reference_log_probs, sharded_world_of_one

from ragen.models.value_head import ValueModel
from ragen.workers import ActorConfig, CriticConfig, CriticWorker, LocalWorkerGroup, PolicyWorker, TrainBatch

FP32 = ActorConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=2, ppo_epochs=2, mixed_precision="fp32",
                   entropy_coef=0.01, clip_high=0.2)
LOG_PROB_ATOL = 1e-4
WEIGHT_ATOL = 1e-4
METRICS = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl", "actor/pg_clipfrac")


@pytest.fixture
def model_dir(tmp_path, tokenizer_dir, no_packaged_model) -> str:
    """The tiny Llama of ``make_lm(seed=1)`` saved with the default tokenizer from ``tokenizer_dir`` (the GPU machine
    has no packaged default model to take it from)."""
    from transformers import AutoTokenizer

    path = tmp_path / "tiny_lm"
    make_lm(seed=1).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return str(path)


def _batch() -> TrainBatch:
    return random_train_batch(8, 24, seed=5, draw=("advantages", "returns"))


def _cpu_update(model_dir: str, cfg: ActorConfig, batch: TrainBatch) -> tuple[dict, dict, torch.Tensor]:
    """(metrics, weights after the update, old log-probs) of the plain (unsharded) worker on CPU."""
    with placed_on("cpu"):
        ref = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
    old = ref.call("compute_log_probs", batch)
    metrics = ref.call("update", batch.with_fields(old_log_probs=old))
    return metrics, ref.call_rank0("full_state_dict"), old


def _sharded_update(model_dir: str, cfg: ActorConfig, batch: TrainBatch, old: torch.Tensor,
                    device: str) -> tuple[torch.Tensor, dict, dict]:
    """(log-probs before the update, metrics, weights after it) of the worker on ``device`` under a one-rank
    process group: FSDP2-sharded, its parameters DTensors."""
    with sharded_world_of_one(device):
        with placed_on(device):
            group = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
        worker = group.worker
        assert worker.device.type == device
        assert all(hasattr(p, "full_tensor") for p in worker.module.parameters())  # fully_shard applied
        lp = group.call("compute_log_probs", batch)
        metrics = group.call("update", batch.with_fields(old_log_probs=old))
        state = group.call_rank0("full_state_dict")
    return lp, metrics, state


def _max_diff(a: dict, b: dict) -> tuple[float, str]:
    assert a.keys() == b.keys()
    return max((float((a[k].float() - b[k].float()).abs().max()), k) for k in a)


def test_fsdp2_update_on_one_rank_equals_the_cpu_update_in_fp32(device, model_dir):
    batch = _batch()
    m_ref, s_ref, old = _cpu_update(model_dir, FP32, batch)
    lp, m, s = _sharded_update(model_dir, FP32, batch, old, device)
    resp = batch.response_mask.bool()
    assert float((lp - old)[resp].abs().max()) <= LOG_PROB_ATOL
    for k in METRICS:
        assert m[k] == pytest.approx(m_ref[k], rel=1e-4, abs=1e-6), (k, m[k], m_ref[k])
    assert m_ref["actor/grad_norm"] > 0 and m_ref["actor/ppo_kl"] != 0  # the second epoch ran on moved weights
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert _max_diff(s_ref, initial)[0] > 5e-4  # two steps of lr 1e-3 moved the weights
    worst, name = _max_diff(s, s_ref)
    assert worst <= WEIGHT_ATOL, f"{device} FSDP2 weights differ from the CPU update by {worst:.3g} at {name}"


# bf16 bounds, against the fp32 update on CPU (one AdamW step): log-probs within 0.1 absolute (bf16 keeps 8
# significant bits, ~4e-3 relative per rounding; logits of ~7 pass through 2 layers); the loss within 0.05
# absolute and the gradient norm within 10% relative; the weight step direction: ||step_bf16 - step_fp32|| at most
# half of ||step_fp32|| (AdamW's first step is ~lr * sign(grad), so it flips only where bf16 flips a gradient sign).
BF16_LOG_PROB_ATOL, BF16_LOSS_ATOL, BF16_GRAD_NORM_REL, BF16_STEP_REL = 0.1, 0.05, 0.1, 0.5


def test_fsdp2_bf16_update_stays_within_bounds_of_fp32(device, model_dir):
    batch = _batch()
    fp32 = dataclasses.replace(FP32, ppo_epochs=1)
    m_ref, s_ref, old = _cpu_update(model_dir, fp32, batch)
    lp, m, s = _sharded_update(model_dir, dataclasses.replace(fp32, mixed_precision="bf16"), batch, old, device)
    resp = batch.response_mask.bool()
    lp_err = float((lp - old)[resp].abs().max())
    assert 0 < lp_err <= BF16_LOG_PROB_ATOL, lp_err  # > 0: the forward did run in bf16
    assert abs(m["actor/pg_loss"] - m_ref["actor/pg_loss"]) <= BF16_LOSS_ATOL, (m, m_ref)
    assert m["actor/grad_norm"] == pytest.approx(m_ref["actor/grad_norm"], rel=BF16_GRAD_NORM_REL)
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    step_ref = torch.cat([(s_ref[k] - initial[k]).flatten() for k in initial])
    step = torch.cat([(s[k].float() - initial[k]).flatten() for k in initial])
    rel = float((step - step_ref).norm() / step_ref.norm())
    assert rel <= BF16_STEP_REL, f"bf16 step differs from the fp32 step by {rel:.3f} of its norm on {device}"
    assert all(s[k].dtype == torch.float32 for k in s)  # fp32 master weights


def _random_head_critic(model_dir: str, folder) -> str:
    """A critic folder (backbone + value head) whose head has random weights, so values are not all zero."""
    torch.manual_seed(3)
    ValueModel(AutoModel.from_pretrained(model_dir), head_init_std=0.5).save(folder)
    return str(folder)


def _reference_values(folder: str, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 CPU values in the critic's convention, written out here: ``values[:, t]`` = head(hidden[t - 1]) where
    tokens t - 1 and t are real (else 0); ``last[b]`` = head(hidden at row b's last real token)."""
    model = ValueModel.load(folder).to(torch.float64)
    ids, attn = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        hidden = model.backbone(input_ids=ids, attention_mask=attn,
                                position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
        after = model.head(hidden).squeeze(-1)
    both = (attn[:, 1:] * attn[:, :-1]).bool()
    values = torch.zeros_like(after)
    values[:, 1:] = torch.where(both, after[:, :-1], 0.0)
    last = after[torch.arange(ids.shape[0]), attn.sum(-1) - 1]
    return values, last


def test_log_probs_and_values_on_the_device_equal_a_cpu_reference(device, model_dir, tmp_path):
    batch = _batch()
    with placed_on(device):
        actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=FP32)
        critic = LocalWorkerGroup(CriticWorker, model_name_or_path=_random_head_critic(model_dir, tmp_path / "c"),
                                  cfg=CriticConfig(mixed_precision="fp32", mini_batch_size=8, micro_batch_size=4))
    assert actor.worker.device.type == critic.worker.device.type == device
    lp = actor.call("compute_log_probs", batch)
    ref = reference_log_probs(AutoModelForCausalLM.from_pretrained(model_dir), batch.input_ids,
                              batch.attention_mask)
    resp = batch.response_mask.bool()
    assert float((lp.double() - ref)[resp].abs().max()) <= LOG_PROB_ATOL
    assert (lp[~resp] == 0).all() and (ref[resp] != 0).all()
    values, last = critic.call("compute_values", batch)
    ref_values, ref_last = _reference_values(str(tmp_path / "c"), batch)
    assert float(ref_values.abs().max()) > 0.1  # the random head makes the values informative
    torch.testing.assert_close(values.double(), ref_values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last.double(), ref_last, atol=1e-5, rtol=1e-5)
