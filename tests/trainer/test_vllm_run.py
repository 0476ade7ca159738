"""vLLM inside the training loop (CPU build, vLLM 0.32.0): a PPO run with ``rollout.engine=vllm`` through the same
builders as a GPU run (``ragen.launch.run``: the engine hosted by the actor's rank, built and put to sleep first,
synced in place after every update). Each step's rollout is sampled with the weights of the step before: the
engine's log-probs equal the trainer's (``rollout/logprob_diff_max``); rollout correction reads the engine's
log-probs (``rollout_correction/*``, ratios of 1); a resumed run syncs the checkpoint's weights into its new engine.

Runs only where vLLM imports (``scripts/test_vllm.sh``); a tiny random model with head size 64 (the CPU attention
kernels' sizes)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here; build its env with scripts/setup_vllm_env.sh")

from trainer_helpers import read_metrics, tiny_overrides  # noqa: E402

from ragen.launch import run  # noqa: E402
from ragen.trainer.config.compose import load_train_config  # noqa: E402

pytestmark = pytest.mark.vllm
GAP = 2e-3  # fp32 vLLM kernels against the fp32 trainer forward (summation order)


def _overrides(run_dir, steps: int) -> list[str]:
    return [*tiny_overrides(run_dir, steps), "trainer.use_ray=false", "trainer.val_before_train=false",
            "trainer.val_freq=0", "trainer.save_freq=1", "trainer.report=false", "rollout.engine=vllm",
            "model.tiny_hidden_size=128", "model.tiny_num_heads=2", "rollout.vllm.enforce_eager=true",
            "rollout.vllm.max_num_seqs=8", "agent.max_model_len=512", "actor.lr=3e-2",
            "algorithm.rollout_correction.mode=token_tis"]


def test_ppo_with_vllm_syncs_every_update_reads_its_log_probs_and_resumes(tmp_path):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    run(load_train_config("ppo_bandit", _overrides(tmp_path, 2)))
    run(load_train_config("ppo_bandit", _overrides(tmp_path, 3)))  # resumes from global_step_2
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:  # steps 2 and 3 sample with the weights of updates 1 and 2 (step 3: in a new engine)
        assert r["rollout/logprob_diff_max"] < GAP, r
        assert r["rollout_correction/ratio_max"] == pytest.approx(1.0, abs=3 * GAP), r
        assert r["rollout_correction/weight_mean"] == pytest.approx(1.0, abs=3 * GAP), r
    assert records[0]["actor/grad_norm"] > 0 and records[1]["actor/grad_norm"] > 0  # the weights did move


def test_async_with_vllm_in_the_driver_stamps_versions_and_syncs(tmp_path):
    """``trainer.async_rollout`` with vLLM on CPU: the engine plays in the driver and gets each version's weights
    through it. At k = 0 every step samples with the weights of the step before (log-prob gap under ``GAP``); at
    k = 1 staleness stays within the bound."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    run(load_train_config("ppo_bandit", [*_overrides(tmp_path / "k0", 3), "trainer.async_rollout=true"]))
    records = read_metrics(tmp_path / "k0")
    assert [r["async/staleness_max"] for r in records] == [0.0, 0.0, 0.0]
    assert all(r["rollout/logprob_diff_max"] < GAP for r in records), records
    assert all(r["actor/grad_norm"] > 0 for r in records)
    run(load_train_config("ppo_bandit", [*_overrides(tmp_path / "k1", 3), "trainer.async_rollout=true",
                                         "trainer.max_staleness=1"]))
    assert max(r["async/staleness_max"] for r in read_metrics(tmp_path / "k1")) <= 1.0
