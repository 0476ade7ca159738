"""Driver options end to end (in-process, tiny model): critic warm-up, critic-free estimators with KL in the
reward and in the loss, and rollout filtering."""

import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, tiny_init_weights, tiny_overrides

from ragen.trainer.compose import load_train_config
from ragen.trainer.main import run

FAST = ["trainer.use_ray=false", "trainer.val_before_train=false"]


def test_critic_warmup_updates_only_the_critic(tmp_path):
    metrics = run(load_train_config("ppo_bandit", [*tiny_overrides(tmp_path, 1), *FAST, "trainer.critic_warmup=1"]))
    assert "critic/vf_loss" in metrics and not any(k.startswith("actor/") for k in metrics)
    final = load_actor_weights(tmp_path / "checkpoints" / "global_step_1")
    init = tiny_init_weights()
    assert all(torch.equal(final[k], init[k]) for k in init)
    assert (tmp_path / "checkpoints" / "global_step_1" / "critic").is_dir()


def test_grpo_with_kl_and_rollout_filter(tmp_path):
    overrides = [*tiny_overrides(tmp_path, 1), *FAST, "algorithm=grpo", "algorithm.kl_in_reward=true",
                 "actor.use_kl_loss=true", "algorithm.rollout_filter_ratio=0.5", "rollout.n_groups=4",
                 "rollout.group_size=2"]
    metrics = run(load_train_config("ppo_bandit", overrides))
    assert metrics["rollout/kept_groups"] == 2 and metrics["rollout/total_groups"] == 4
    assert metrics["rollout/batch_size"] == 4
    assert "actor/reward_kl_penalty" in metrics and "actor/kl_loss" in metrics and "timing/ref_log_probs" in metrics
    assert not any(k.startswith("critic/") and "advantages" not in k and "returns" not in k for k in metrics)
    assert not (tmp_path / "checkpoints" / "global_step_1" / "critic").exists()
    assert_all_finite(read_metrics(tmp_path))
