"""Driver options end to end (in-process, tiny model): critic warm-up, critic-free estimators with KL in the
reward and in the loss, and rollout filtering."""

import math

import pytest
import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_init_weights, tiny_overrides

from ragen.algorithms.losses import kl_penalties
from ragen.algorithms.rollout_correction import rollout_correction_weights
from ragen.launch import run
from ragen.trainer import credit
from ragen.trainer.config.compose import load_train_config
from ragen.workers import LocalWorkerGroup, PolicyWorker

FAST = ["trainer.use_ray=false", "trainer.val_before_train=false", "trainer.sft_warmup_steps=0"]


def test_critic_warmup_updates_only_the_critic(tmp_path):
    metrics = run(load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), *FAST, "trainer.critic_warmup=1"]))
    assert "critic/vf_loss" in metrics and not any(k.startswith("actor/") for k in metrics)
    final = load_actor_weights(tmp_path / "checkpoints" / "global_step_1")
    init = tiny_init_weights()
    assert all(torch.equal(final[k], init[k]) for k in init)
    assert (tmp_path / "checkpoints" / "global_step_1" / "critic").is_dir()


def test_kl_penalties_hand_numbers():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 5.0]])
    lp = torch.tensor([[-1.0, -0.5, -2.0, -3.0], [-0.1, -0.2, -0.3, -0.4]])
    ref = torch.tensor([[-1.5, -0.5, -1.0, -9.0], [-0.4, -0.2, -0.3, -0.1]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # masked-out tokens keep their reward (5.0 at [1, 3] is in)
    pen, m = kl_penalties(lp, ref, mask, coef=0.5, kind="k1")
    out = rewards + pen  # what the estimators see: token_rewards + token_penalties
    # k1 = lp - ref on the mask: [[0.5, 0, -1, -], [-, 0, 0, -0.3]]
    expected = torch.tensor([[0.0 - 0.25, 0.0, 1.0 + 0.5, 0.0], [0.0, 2.0, 0.0, 5.0 + 0.15]])
    torch.testing.assert_close(out, expected)
    assert m["actor/reward_kl_penalty"] == pytest.approx((0.5 + 0.0 - 1.0 + 0.0 + 0.0 - 0.3) / 6)
    assert m["actor/reward_kl_penalty_coef"] == 0.5
    pen3, m3 = kl_penalties(lp, ref, mask, coef=2.0, kind="k3")
    out3 = rewards + pen3
    k3 = lambda d: math.exp(-d) + d - 1.0  # noqa: E731
    assert float(out3[0, 0]) == pytest.approx(0.0 - 2.0 * k3(0.5))
    assert float(out3[0, 2]) == pytest.approx(1.0 - 2.0 * k3(-1.0))
    assert float(out3[1, 3]) == pytest.approx(5.0 - 2.0 * k3(-0.3))
    assert float(out3[0, 3]) == 0.0 and float(out3[1, 0]) == 0.0  # off the mask: untouched
    assert m3["actor/reward_kl_penalty"] > 0  # k3 >= 0


def test_grpo_with_kl_and_rollout_filter(tmp_path, monkeypatch):
    """Two steps with KL in the reward and in the loss. Step 1: the reference equals the actor, so both KL terms
    are ~0. Step 2: the actor has moved, and the rewards the estimator gets are exactly the env token rewards minus
    kl_coef * (log pi_old - log pi_ref) on model tokens (k1). (The tiny model's rewards are all equal, so its group
    advantages are 0: the entropy bonus is what moves the actor at step 1.)"""
    seen = {"log_probs": [], "batches": [], "inputs": []}
    real_lp, real_tb, real_ca = PolicyWorker.compute_log_probs, credit.to_train_batch, credit.compute_advantage

    def spy_lp(self, batch):
        out = real_lp(self, batch)
        seen["log_probs"].append((self.role, out.clone()))
        return out

    def spy_tb(batch, **kw):
        seen["batches"].append(batch)
        return real_tb(batch, **kw)

    def spy_ca(name, inputs, **kw):
        seen["inputs"].append(inputs)
        return real_ca(name, inputs, **kw)

    monkeypatch.setattr(PolicyWorker, "compute_log_probs", spy_lp)
    monkeypatch.setattr(credit, "to_train_batch", spy_tb)
    monkeypatch.setattr(credit, "compute_advantage", spy_ca)
    coef = 0.5
    overrides = [*tiny_overrides(tmp_path, 2), *FAST, "algorithm=grpo", "algorithm.kl_in_reward=true",
                 f"algorithm.kl_coef={coef}", "algorithm.kl_kind=k1", "actor.use_kl_loss=true",
                 "actor.kl_kind=k3", "algorithm.rollout_filter_ratio=0.5", "rollout.n_groups=4",
                 "rollout.group_size=2", "actor.lr=1e-2", "actor.entropy_coef=0.1",
                 "trainer.report=false"]  # the report's validation credit would add log-prob calls to the spies
    metrics = run(load_train_config("ppo_bandit", overrides))
    assert metrics["rollout/kept_groups"] == 2 and metrics["rollout/total_groups"] == 4
    assert metrics["rollout/batch_size"] == 4
    assert "timing/ref_log_probs" in metrics
    assert not any(k.startswith("critic/") and "advantages" not in k and "returns" not in k for k in metrics)
    assert not (tmp_path / "checkpoints" / "global_step_2" / "critic").exists()
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    step1, step2 = (next(r for r in records if r["step"] == s and "actor/kl_loss" in r) for s in (1, 2))
    assert abs(step1["actor/kl_loss"]) < 1e-5 and abs(step1["actor/reward_kl_penalty"]) < 1e-5
    assert step1["actor/reward_kl_penalty_coef"] == coef
    assert step2["actor/kl_loss"] > 1e-6  # k3 > 0 once the actor moved away from the reference

    roles = [role for role, _ in seen["log_probs"]]
    assert roles == ["actor", "ref", "actor", "ref"], roles  # old log-probs, then reference, per step
    assert len(seen["batches"]) == len(seen["inputs"]) == 2
    for step in range(2):
        old, ref = seen["log_probs"][2 * step][1], seen["log_probs"][2 * step + 1][1]
        batch, inputs = seen["batches"][step], seen["inputs"][step]
        mask = batch.response_mask.bool()
        fed = inputs.token_rewards.double()
        if getattr(inputs, "token_penalties", None) is not None:
            fed = fed + inputs.token_penalties.double()
        expected = batch.token_rewards.double() - coef * (old.double() - ref.double())
        torch.testing.assert_close(fed[mask], expected[mask], atol=1e-6, rtol=0)
        torch.testing.assert_close(fed[~mask], batch.token_rewards.double()[~mask], atol=0, rtol=0)
        if step == 0:
            assert (old - ref)[mask].abs().max() < 1e-5
        else:
            assert (old - ref)[mask].abs().max() > 1e-3  # the check above is not vacuous at step 2


def test_rollout_correction_weights_reach_the_actor(tmp_path, monkeypatch):
    """algorithm.rollout_correction: the driver computes the weights from the engine's log-probs and the actor's old
    log-probs (a turn-layout episode's rows share one sequence ratio) and hands them to the actor's update as
    ``is_weights`` (padding rows 0). On CPU in fp32 the engine and the trainer agree to ~1e-5."""
    seen = {"old": [], "batches": [], "updates": []}
    real_tb, real_call = credit.to_train_batch, LocalWorkerGroup.call

    def spy_tb(batch, **kw):
        seen["batches"].append(batch)
        return real_tb(batch, **kw)

    def spy_call(self, method, batch=None, **kw):  # the driver's batches and results, in the driver's row order
        out = real_call(self, method, batch, **kw)
        if method == "update":
            seen["updates"].append(batch)
        elif method == "compute_log_probs":
            seen["old"].append(out.clone())
        return out

    monkeypatch.setattr(credit, "to_train_batch", spy_tb)
    monkeypatch.setattr(LocalWorkerGroup, "call", spy_call)
    overrides = [*tiny_overrides(tmp_path, 1), *FAST, "algorithm=grpo", "env=frozen_lake", "env.max_turn=2",
                 "agent.layout=turn", "actor.mini_batch_size=3", "actor.micro_batch_size=1", "trainer.report=false",
                 "algorithm.rollout_correction.mode=seq_tis", "algorithm.rollout_correction.seq_agg=product"]
    metrics = run(load_train_config("base", overrides))
    batch, old, update = seen["batches"][0], seen["old"][0], seen["updates"][0]
    n = batch.batch_size
    expected, _ = rollout_correction_weights(old[:n], batch.sample_log_probs, batch.response_mask, mode="seq_tis",
                                             seq_agg="product", seq_ids=batch.episode_index)
    assert update.batch_size % 3 == 0 and update.batch_size >= n
    torch.testing.assert_close(update.is_weights[:n], expected, atol=0, rtol=0)
    assert not update.is_weights[n:].any()
    mask = batch.response_mask.bool()
    assert bool((update.is_weights[:n][mask] > 0).all())
    assert abs(metrics["rollout_correction/ratio_mean"] - 1.0) < 1e-3 and metrics["rollout/logprob_diff_max"] < 1e-3
    assert metrics["rollout_correction/weight_mean"] == pytest.approx(float(expected[mask].mean()), rel=1e-6)


def test_thread_counts_per_process(tmp_path, monkeypatch):
    """The driver (hf engine) takes every core on CPU and the workers share them per role; trainer.num_threads
    overrides both."""
    from ragen.trainer import builders

    monkeypatch.setattr(builders.os, "cpu_count", lambda: 8)
    free = [*tiny_overrides(tmp_path, 1), "trainer.num_threads=null"]
    cfg = load_train_config("ppo_bandit", free)
    assert builders.driver_threads(cfg) == 8 and builders.worker_threads(cfg) == 8
    two = load_train_config("ppo_bandit", [*free, "trainer.actor_world_size=2"])
    assert builders.driver_threads(two) == 8 and builders.worker_threads(two) == 4
    fixed = load_train_config("ppo_bandit", [*free, "trainer.num_threads=3"])
    assert builders.driver_threads(fixed) == 3 and builders.worker_threads(fixed) == 3


def test_lora_actor_is_its_own_reference_and_syncs_merged_weights(tmp_path, monkeypatch):
    """``actor.lora_rank>0`` with KL in the reward and the loss: no reference worker is built, the reference
    log-probs come from the actor with adapters off (equal to the old log-probs at step 1, apart at step 2), the
    engine samples step 2 with the merged weights (sampler/trainer gap as small as at step 1, while the policy
    moved), and the checkpoint holds merged weights plus the adapters."""
    calls = []
    real_ref = PolicyWorker.compute_ref_log_probs

    def spy_ref(self, batch):
        calls.append(self.role)
        return real_ref(self, batch)

    monkeypatch.setattr(PolicyWorker, "compute_ref_log_probs", spy_ref)
    overrides = [*tiny_overrides(tmp_path, 2), *FAST, "algorithm=grpo", "algorithm.kl_in_reward=true",
                 "actor.use_kl_loss=true", "actor.lora_rank=4", "actor.lr=5e-2", "actor.entropy_coef=0.5",
                 "rollout.n_groups=4", "actor.mini_batch_size=8", "trainer.report=false"]
    run(load_train_config("ppo_bandit", overrides))
    assert calls == ["actor", "actor"]
    records = [r for r in read_metrics(tmp_path) if "actor/kl_loss" in r]
    assert_all_finite(records)
    step1, step2 = records
    assert abs(step1["actor/kl_loss"]) < 1e-6 and step2["actor/kl_loss"] > 1e-5
    assert step2["rollout/logprob_diff_max"] < 1e-3  # the engine got the merged weights
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    assert (ckpt / "actor" / "lora" / "adapter.safetensors").is_file() and not (ckpt / "ref").exists()
    final, init = load_actor_weights(ckpt), tiny_init_weights()
    assert set(init) <= set(final) and max(float((final[k] - init[k]).abs().max()) for k in init) > 1e-4


def test_shared_backbone_critic_runs_on_the_actor(tmp_path):
    """critic.share_backbone=true with GAE: no critic worker or checkpoint, the values come from the actor's head
    (zero at step 1, fitted after), the joint update reports critic/* metrics and the head is checkpointed."""
    overrides = [*tiny_overrides(tmp_path, 2), *FAST, "critic.share_backbone=true", "critic.lr=5e-2",
                 "trainer.report=false"]
    run(load_train_config("ppo_bandit", overrides))
    records = [r for r in read_metrics(tmp_path) if "critic/vf_loss" in r]
    assert_all_finite(records)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["critic/values/mean"] == 0.0 and records[1]["critic/values/mean"] != 0.0
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    assert (ckpt / "actor" / "value_head.safetensors").is_file() and not (ckpt / "critic").exists()
