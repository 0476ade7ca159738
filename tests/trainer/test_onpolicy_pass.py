"""The old-log-prob pass is skipped where the actor's update is exactly on-policy, and nothing changes but rounding.

``credit.old_log_probs_reader`` decides per step; the driver then hands the actor no old log-probs and its loss
uses its own detached ones (ratio 1). Each reader of the old log-probs keeps the pass on its own.
"""

import pytest
import torch
from trainer_helpers import tiny_overrides

from ragen.trainer import credit
from ragen.trainer.config.compose import load_train_config

ON_POLICY = {"ppo_epochs": 1, "mini_batch_size": 4, "rows": 4, "correction_mode": "none", "kl_in_reward": False,
             "shared_value_head": False}


def test_on_policy_needs_no_pass():
    assert credit.old_log_probs_reader(**ON_POLICY) is None
    assert credit.old_log_probs_reader(**{**ON_POLICY, "rows": 2}) is None  # fewer rows than a mini-batch


@pytest.mark.parametrize("change, reason", [
    ({"ppo_epochs": 2}, "actor.ppo_epochs=2"),
    ({"rows": 8}, "8 rows in mini-batches of 4"),
    ({"correction_mode": "token_tis"}, "algorithm.rollout_correction.mode=token_tis"),
    ({"kl_in_reward": True}, "algorithm.kl_in_reward"),
    ({"shared_value_head": True}, "the shared value head's values"),
])
def test_each_reader_keeps_the_pass(change, reason):
    assert credit.old_log_probs_reader(**{**ON_POLICY, **change}) == reason


GRPO = ("algorithm=grpo", "trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0",
        "trainer.report=false", "trainer.save_freq=0")


def _graded_credit(real):
    """``step_credit`` with the advantages replaced by distinct ones per row: the tiny random model's bandit rewards
    are all equal, so GRPO's own advantages (0) would move no weight."""
    def step_credit(alg, estimate, batch, *args):
        adv, ret, metrics = real(alg, estimate, batch, *args)
        rows = torch.arange(batch.batch_size, dtype=adv.dtype)[:, None] - 1.5
        return rows * batch.response_mask.to(adv.dtype), ret, metrics
    return step_credit


def _one_step(tmp_path, monkeypatch, *extra, keep_pass=False):
    """One GRPO step of the tiny fp32 model (4 rows, mini-batches of 4) with graded advantages; returns
    (metrics, actor weights). ``keep_pass``: force the old-log-prob pass (the reference the skip is compared with)."""
    from ragen.ppo.trainer import PPOTrainer

    cfg = load_train_config("base", [*tiny_overrides(tmp_path, 1), *GRPO, *extra])
    trainer = PPOTrainer(cfg)
    monkeypatch.setattr(credit, "step_credit", _graded_credit(credit.step_credit))
    if keep_pass:
        monkeypatch.setattr(trainer, "_old_log_probs_reader", lambda rows, shared_head: "forced")
    trainer.setup()
    try:
        metrics = trainer.train_step()
        weights = trainer.run.workers["actor"].call_rank0("full_state_dict")
    finally:
        trainer.shutdown()
    return metrics, {k: v.detach().clone() for k, v in weights.items()}


def test_skipped_pass_gives_the_same_weights(tmp_path, monkeypatch):
    skipped, w_skip = _one_step(tmp_path / "skip", monkeypatch)
    kept, w_kept = _one_step(tmp_path / "kept", monkeypatch, keep_pass=True)
    assert "timing/old_log_probs" not in skipped and "timing/old_log_probs" in kept
    assert "rollout/logprob_diff_mean" not in skipped and "rollout/logprob_diff_mean" in kept
    assert skipped["actor/ppo_kl"] == 0.0 and skipped["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    assert skipped["actor/grad_norm"] > 1e-3  # the step moves the weights
    assert skipped["actor/grad_norm"] == pytest.approx(kept["actor/grad_norm"], rel=1e-5)
    assert skipped["actor/pg_loss"] == pytest.approx(kept["actor/pg_loss"], abs=1e-6)
    assert w_skip.keys() == w_kept.keys()
    for name, w in w_skip.items():
        torch.testing.assert_close(w, w_kept[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("extra", [
    ("actor.ppo_epochs=2",),  # negative control: a second epoch is off-policy
    ("actor.mini_batch_size=2",),  # two mini-batches: the second is off-policy
    ("algorithm.rollout_correction.mode=token_tis",),
    ("algorithm.kl_in_reward=true",),
    ("algorithm=gae", "critic.share_backbone=true"),
], ids=["two_epochs", "two_mini_batches", "rollout_correction", "kl_in_reward", "shared_value_head"])
def test_a_reader_keeps_the_pass(tmp_path, monkeypatch, extra):
    metrics, _ = _one_step(tmp_path, monkeypatch, *extra)
    assert "timing/old_log_probs" in metrics and "rollout/logprob_diff_mean" in metrics


def test_report_samples_get_their_own_small_pass(tmp_path, monkeypatch):
    """The run report's training samples need old log-probs of their rows only: the whole-batch pass stays skipped,
    and the saved log-probs are those the whole-batch pass gives (the forced side)."""
    import json

    report = ("trainer.report=true", "trainer.report_train_samples=2")
    skipped, w_skip = _one_step(tmp_path / "skip", monkeypatch, *report)
    kept, w_kept = _one_step(tmp_path / "kept", monkeypatch, *report, keep_pass=True)
    assert "timing/old_log_probs" not in skipped and "timing/report_samples" in skipped

    def saved(run):
        with (tmp_path / run / "train_samples" / "step_1.jsonl").open() as fh:
            return [json.loads(line) for line in fh]

    a, b = saved("skip"), saved("kept")
    assert len(a) == len(b) == 2
    for ea, eb in zip(a, b, strict=True):
        for ra, rb in zip(ea["rows"], eb["rows"], strict=True):
            assert ra["token_ids"] == rb["token_ids"]
            lp_a, lp_b = torch.tensor(ra["log_probs"]), torch.tensor(rb["log_probs"])
            mask = torch.tensor(ra["response_mask"]).bool()
            assert mask.any() and bool((lp_a[mask] != 0).all())
            torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-5)
    for name, w in w_skip.items():
        torch.testing.assert_close(w, w_kept[name], rtol=0, atol=1e-6, msg=name)
