"""PolicyWorker / CriticWorker on one rank: split invariance, learning, KL loss, save/load, ref role."""

from __future__ import annotations

import math

import pytest
import torch
from factories import random_train_batch
from transformers import AutoModelForCausalLM

from ragen.workers import ActorConfig, CriticConfig, CriticWorker, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.logprob import token_log_probs

MODEL: dict = {}  # filled by the autouse fixture: the saved tiny model folder


@pytest.fixture(autouse=True, scope="module")
def _model(model_dir):
    MODEL["path"] = model_dir


def actor(**cfg) -> LocalWorkerGroup:
    base = {"lr": 1e-3, "mini_batch_size": 8, "micro_batch_size": 8, "mixed_precision": "fp32"}
    return LocalWorkerGroup(PolicyWorker, model_name_or_path=MODEL["path"], cfg=ActorConfig(**{**base, **cfg}))


@pytest.fixture(scope="module")
def batch(model_dir) -> TrainBatch:
    b = random_train_batch(8, 24, seed=7, draw=("advantages",))
    lp = actor().call("compute_log_probs", b)
    return b.with_fields(old_log_probs=lp)


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_split_invariance(batch, agg):
    one = actor(micro_batch_size=8, loss_agg=agg, entropy_coef=0.01)
    four = actor(micro_batch_size=2, loss_agg=agg, entropy_coef=0.01)
    m1, m4 = one.call("update", batch), four.call("update", batch)
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac", "actor/loss"):
        assert m4[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
    s1, s4 = one.call_rank0("full_state_dict"), four.call_rank0("full_state_dict")
    assert _max_diff(s1, s4) < 1e-5


def test_update_moves_params_and_lowers_surrogate(batch):
    g = actor(mini_batch_size=4, micro_batch_size=2)
    before = g.call_rank0("full_state_dict")
    losses = [g.call("update", batch)["actor/pg_loss"] for _ in range(4)]
    assert _max_diff(before, g.call_rank0("full_state_dict")) > 1e-4
    assert losses[-1] < losses[0] - 0.05, losses
    # the surrogate at ratio 1 is -mean(A); after training the new log-probs raise it where A > 0
    new_lp = g.call("compute_log_probs", batch)
    m = batch.response_mask.bool().clone()
    m[:, 0] = False
    gain = ((new_lp - batch.old_log_probs) * batch.advantages)[m].sum()
    assert gain > 0


def test_metrics_at_first_step_are_hand_computable(batch):
    m = actor(lr=0.0).call("update", batch)
    mask = batch.response_mask.bool().clone()
    mask[:, 0] = False
    assert m["actor/pg_loss"] == pytest.approx(float(-batch.advantages[batch.response_mask.bool()].sum()
                                                      / batch.response_mask.sum()), rel=1e-5)
    assert abs(m["actor/ppo_kl"]) < 1e-6 and m["actor/pg_clipfrac"] == 0.0
    assert m["actor/lr"] == 0.0 and m["actor/grad_norm"] > 0
    assert 0 < m["actor/entropy"] <= math.log(1000) + 1e-4


def test_rollout_correction_weights_scale_each_token_loss(batch):
    # ratio 1 at the first step: pg_loss = -sum(w A) / n over the response; zero weights leave no policy gradient
    w = torch.rand(8, 24, generator=torch.Generator().manual_seed(9)) * 2.0 * batch.response_mask
    m = actor(lr=0.0).call("update", batch.with_fields(is_weights=w))
    mask = batch.response_mask.bool()
    assert m["actor/pg_loss"] == pytest.approx(float(-(w * batch.advantages)[mask].sum() / mask.sum()), rel=1e-5)
    zero = actor(lr=0.0).call("update", batch.with_fields(is_weights=torch.zeros_like(w)))
    assert zero["actor/pg_loss"] == 0.0 and zero["actor/grad_norm"] == 0.0


def test_kl_loss_path(batch):
    with pytest.raises(ValueError, match="ref_log_probs"):
        actor(use_kl_loss=True).call("update", batch)
    shift = batch.old_log_probs - 0.5 * batch.response_mask  # d = log pi - log pi_ref = 0.5 on the response
    b = batch.with_fields(ref_log_probs=shift)
    m = actor(lr=0.0, use_kl_loss=True, kl_loss_coef=0.5, kl_kind="k3").call("update", b)
    k3 = math.exp(-0.5) + 0.5 - 1.0
    # position 0 has log-prob 0 on both sides (d = 0.5 there too when it is in the response)
    assert m["actor/kl"] == pytest.approx(k3, rel=1e-4)
    assert m["actor/kl_loss"] == pytest.approx(k3, rel=1e-4)
    assert m["actor/loss"] == pytest.approx(m["actor/pg_loss"] + 0.5 * k3, rel=1e-4)
    # with zero advantages, the KL term alone pulls log-probs down towards the (lower) reference
    g = actor(lr=3e-3, use_kl_loss=True, kl_loss_coef=1.0, kl_kind="k1")
    b0 = b.with_fields(advantages=torch.zeros_like(b.advantages))
    for _ in range(3):
        g.call("update", b0)
    m = b.response_mask.bool()
    assert (g.call("compute_log_probs", b)[m] - b.old_log_probs[m]).mean() < -0.01


def test_save_load_and_from_pretrained(batch, tmp_path):
    g = actor(mini_batch_size=4, micro_batch_size=2)
    g.call("update", batch)
    g.call("save", dir=str(tmp_path))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path)
    lp_hf, _ = token_log_probs(hf, batch.input_ids, batch.attention_mask, target_mask=batch.response_mask)
    lp = g.call("compute_log_probs", batch)
    torch.testing.assert_close(lp_hf, lp, atol=1e-5, rtol=1e-5)
    assert (tmp_path / "tokenizer_config.json").is_file() and (tmp_path / "optimizer.pt").is_file()
    # a fresh worker restored from the checkpoint continues exactly like the original
    h = actor(mini_batch_size=4, micro_batch_size=2)
    h.call("load", dir=str(tmp_path))
    assert _max_diff(h.call_rank0("full_state_dict"), g.call_rank0("full_state_dict")) == 0
    mg, mh = g.call("update", batch), h.call("update", batch)
    assert mh["actor/pg_loss"] == pytest.approx(mg["actor/pg_loss"], rel=1e-6)
    assert _max_diff(h.call_rank0("full_state_dict"), g.call_rank0("full_state_dict")) < 1e-6


def test_ref_role_is_frozen(batch):
    ref = LocalWorkerGroup(PolicyWorker, model_name_or_path=MODEL["path"], cfg=ActorConfig(mixed_precision="fp32"),
                           role="ref")
    torch.testing.assert_close(ref.call("compute_log_probs", batch), batch.old_log_probs)
    with pytest.raises(RuntimeError, match="frozen"):
        ref.call("update", batch)
    assert not any(p.requires_grad for p in ref.worker.module.parameters())


def test_bf16_mixed_precision_keeps_fp32_master_weights(batch):
    """The one bf16 update test (other tests pin fp32): the model is tiny, so emulated bf16 is fast enough."""
    g = actor(mixed_precision="bf16", mini_batch_size=4, micro_batch_size=2)
    lp = g.call("compute_log_probs", batch)
    m = batch.response_mask.bool()
    assert (lp[m] - batch.old_log_probs[m]).abs().max() < 0.1  # bf16 compute, same distribution
    g.call("update", batch)
    assert all(p.dtype == torch.float32 for p in g.worker.module.parameters())
    assert all(p.dtype == torch.float32 for s in g.worker.trainable.optimizer.state.values()
               for p in s.values() if p.dim() > 0)


@pytest.mark.parametrize(("native", "matches_fp32"), [("0", True), ("1", False)])
def test_auto_precision_is_resolved_by_the_worker(batch, monkeypatch, native, matches_fp32):
    """``mixed_precision='auto'`` (the default) is fp32 on a device without native bf16 (bit-identical log-probs)
    and bf16 autocast with native bf16; the worker's config keeps ``auto``."""
    monkeypatch.setenv("RAGEN_NATIVE_BF16", native)
    g = actor(mixed_precision="auto")
    lp = g.call("compute_log_probs", batch)
    m = batch.response_mask.bool()
    assert g.worker.cfg.mixed_precision == "auto"
    assert torch.equal(lp, batch.old_log_probs) is matches_fp32
    assert (lp[m] - batch.old_log_probs[m]).abs().max() < 0.1


def test_critic_masks_env_tokens(batch):
    def critic(mask_env):
        cfg = CriticConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=4, mixed_precision="fp32",
                           mask_env_tokens=mask_env)
        return LocalWorkerGroup(CriticWorker, model_name_or_path=MODEL["path"], cfg=cfg)

    c = critic(True)
    values, last_values = c.call("compute_values", batch)
    assert values.shape == batch.input_ids.shape and (values == 0).all()  # zero-initialised head
    assert last_values.shape == (batch.batch_size,) and (last_values == 0).all()
    returns = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(3))
    b = batch.with_fields(values=values, returns=returns * batch.response_mask)
    b_env = batch.with_fields(values=values, returns=returns * batch.attention_mask)  # differs only off-response
    m, m_env = critic(True).call("update", b), critic(True).call("update", b_env)
    r = returns[batch.response_mask.bool()]
    assert m["critic/vf_loss"] == pytest.approx(0.5 * float((r ** 2).mean()), rel=1e-5)
    assert m_env["critic/vf_loss"] == pytest.approx(m["critic/vf_loss"], rel=1e-6)
    all_tok = critic(False).call("update", b_env)
    r_all = returns[batch.attention_mask.bool()]
    assert all_tok["critic/vf_loss"] == pytest.approx(0.5 * float((r_all ** 2).mean()), rel=1e-5)
    for _ in range(5):
        last = c.call("update", b)
    assert last["critic/vf_loss"] < m["critic/vf_loss"]


def test_tiny_kwarg_and_local_group_world_size():
    g = LocalWorkerGroup(PolicyWorker, model_name_or_path="unused", cfg=ActorConfig(mixed_precision="fp32"),
                         tiny={"hidden_size": 32, "num_layers": 1, "num_heads": 4})
    ids = torch.tensor([[1, 2, 3, 0]])
    attn = torch.tensor([[1, 1, 1, 0]])
    lp = g.call("compute_log_probs", TrainBatch(ids, attn, attn))
    assert lp.shape == (1, 4) and (lp[0, 1:3] < 0).all() and lp[0, 3] == 0
    assert g.worker.config.vocab_size == 49152
    with pytest.raises(ValueError, match="world_size=1 only"):
        LocalWorkerGroup(PolicyWorker, world_size=2)


def test_one_extreme_log_prob_gap_does_not_skip_the_step(batch):
    # a stale or corrupt old log-prob 100 nats below the current one on one token: its ratio is clamped (e^20), so
    # the mini-batch's gradient stays finite and the optimizer step runs instead of being skipped
    old = batch.old_log_probs.clone()
    row, col = 0, int(batch.response_mask[0].nonzero()[-1])
    old[row, col] -= 100.0
    adv = batch.advantages.clone()
    adv[row, col] = -1.0
    g = actor()
    before = g.call_rank0("full_state_dict")
    m = g.call("update", batch.with_fields(old_log_probs=old, advantages=adv))
    assert m["actor/skipped_steps"] == 0.0 and math.isfinite(m["actor/grad_norm"])
    assert _max_diff(before, g.call_rank0("full_state_dict")) > 1e-4


def test_rejected_tokens_leave_the_actor_loss_and_its_normaliser(batch):
    # keep_mask (rollout correction's *_mask modes): the update equals one on a loss mask without those tokens
    keep = (torch.rand(8, 24, generator=torch.Generator().manual_seed(3)) > 0.3).long()
    a, b = actor(entropy_coef=0.01), actor(entropy_coef=0.01)
    ma = a.call("update", batch.with_fields(keep_mask=keep))
    mb = b.call("update", batch.with_fields(loss_mask=batch.response_mask * keep))
    for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert ma[k] == pytest.approx(mb[k], rel=1e-6), k
    assert _max_diff(a.call_rank0("full_state_dict"), b.call_rank0("full_state_dict")) == 0.0


def test_on_policy_update_takes_its_own_log_probs_as_the_old_ones(batch):
    """One epoch over one mini-batch without old log-probs: the update's detached log-probs are the old ones, and
    the weights equal an update given the pass's old log-probs; with two mini-batches (or two epochs) the second
    one is off-policy and the update refuses to run without them."""
    with_old, without = actor(), actor()
    m_with = with_old.call("update", batch)
    m_without = without.call("update", batch.with_fields(old_log_probs=None))
    assert m_without["actor/ppo_kl"] == 0.0 and m_without["actor/pg_clipfrac"] == 0.0
    assert m_without["actor/grad_norm"] == pytest.approx(m_with["actor/grad_norm"], rel=1e-5)
    assert _max_diff(with_old.call_rank0("full_state_dict"), without.call_rank0("full_state_dict")) < 1e-6
    for off_policy in ({"mini_batch_size": 4}, {"ppo_epochs": 2}):
        with pytest.raises(ValueError, match="old_log_probs"):
            actor(**off_policy).call("update", batch.with_fields(old_log_probs=None))
