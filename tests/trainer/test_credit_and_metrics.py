"""Unit tests of the driver's pure helpers: rollout filtering, metrics, trainer-state helpers."""

import dataclasses
import json
import random

import pytest
import torch
from factories import rollout_batch

from ragen.agent.batch import EpisodeRecord, RolloutBatch, TurnRecord, episode_records
from ragen.trainer.credit import advantages, filter_groups_by_std, trajectory_rewards
from ragen.trainer.metrics import batch_metrics, perf_metrics
from ragen.trainer.state import rng_preserved, trim_metrics


def _batch(rewards: list[float], group_size: int) -> RolloutBatch:
    """One-turn rows of 6 tokens (ids 6i..6i+5): a 2-token prompt, a 3-token response, an end-of-turn token."""
    b, t = len(rewards), 6
    ids = torch.arange(b * t).view(b, t).tolist()
    return rollout_batch(
        [[(row[:2], -1), (row[2:5], 0), (row[5:], -1)] for row in ids], [[r] for r in rewards],
        group_ids=torch.arange(b) // group_size,
        episodes=[EpisodeRecord("bandit", 7 + i // group_size, i // group_size,
                                [TurnRecord("obs", "<answer>x</answer>", ["x"], r, r > 0.5, True)], r > 0.5)
                  for i, r in enumerate(rewards)],
    )


def test_filter_keeps_highest_std_groups_in_order():
    # group 0: std 0; group 1: std 0.5; group 2: std 0.05; group 3: std 0.5 (tie with 1: lower id first)
    rewards = [1, 1, 0, 1, 0.1, 0.0, 1.0, 0.0]
    batch = _batch(rewards, 2)
    kept, m = filter_groups_by_std(batch, 0.5)
    assert kept.group_ids.tolist() == [1, 1, 3, 3]
    assert trajectory_rewards(kept).tolist() == [0, 1, 1, 0]
    assert m["rollout/kept_groups"] == 2 and m["rollout/total_groups"] == 4
    assert abs(m["rollout/kept_group_reward_std_mean"] - 0.5) < 1e-6
    kept, _ = filter_groups_by_std(batch, 0.75)  # ceil(3) groups: 1, 3 and 2
    assert kept.group_ids.tolist() == [1, 1, 2, 2, 3, 3]
    same, _ = filter_groups_by_std(batch, 1.0)
    assert same is batch


def test_advantages_and_metrics_on_a_batch():
    batch = _batch([1.0, 0.0, 0.5, 0.5], 2)
    adv, ret = advantages("grpo", batch, batch.token_rewards, None, whiten=False, eps=1e-6)
    # grpo: group 0 -> +-1/std(unbiased)=+-0.7071; group 1 equal -> 0; broadcast on the 3 model tokens
    expected = torch.tensor([0.70710, -0.70710, 0.0, 0.0])
    assert torch.allclose(adv[:, 2], expected, atol=1e-4) and torch.equal(adv[:, 0], torch.zeros(4))
    m = batch_metrics(batch, adv, ret, None)
    assert m["reward/mean"] == 0.5 and m["reward/max"] == 1.0 and m["rollout/response_tokens_mean"] == 3.0
    assert abs(m["critic/advantages/max"] - 0.7071) < 1e-3
    p = perf_metrics(batch, 2.0, {"rollout": 1.0, "actor_update": 0.5})
    assert p["perf/total_tokens"] == 24 and p["perf/tokens_per_s"] == 12 and p["perf/rollout_tokens_per_s"] == 12
    assert p["perf/actor_update_tokens_per_s"] == 48


def test_episode_records_are_json():
    recs = episode_records(_batch([1.0, 0.0], 2))
    text = json.dumps(recs)
    assert json.loads(text)[0]["turns"][0] == {"prompt": "obs", "response": "<answer>x</answer>", "actions": ["x"],
                                                "reward": 1.0, "success": True, "format_ok": True}
    assert recs[1]["success"] is False and recs[0]["seed"] == 7


def test_rng_preserved_and_trim_metrics(tmp_path):
    torch.manual_seed(0)
    random.seed(0)
    with rng_preserved():
        torch.rand(5)
        random.random()
    a = (torch.rand(1), random.random())
    torch.manual_seed(0)
    random.seed(0)
    assert torch.equal(a[0], torch.rand(1)) and a[1] == random.random()
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (0, 1, 2, 3)))
    assert [r["step"] for r in trim_metrics(path, 2)] == [0, 1, 2]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]
    assert [r["step"] for r in trim_metrics(path, 0)] == [0]  # resumed at step 0: the warm-start checkpoint
    assert trim_metrics(path, None) == [] and path.read_text() == ""  # a fresh start
    assert trim_metrics(tmp_path / "missing.jsonl", 3) == []


def test_logprob_gap_metrics_over_response_tokens_only():
    """Sampler-vs-trainer gap: mean and max |engine - trainer| log-prob over response tokens; other positions
    (prompt, env, pad, masked rows) never count, and an empty mask gives 0."""
    from ragen.trainer.metrics import logprob_gap_metrics

    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    engine = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, 0.0, -0.5, -3.0]])
    trainer = torch.tensor([[9.0, -1.1, -1.8, 5.0], [7.0, 7.0, -0.5, -2.4]])  # off-mask entries are garbage
    out = logprob_gap_metrics(engine, trainer, mask)
    assert out.keys() == {"rollout/logprob_diff_mean", "rollout/logprob_diff_max"}
    assert out["rollout/logprob_diff_mean"] == pytest.approx((0.1 + 0.2 + 0.0 + 0.6) / 4)
    assert out["rollout/logprob_diff_max"] == pytest.approx(0.6)
    empty = logprob_gap_metrics(engine, trainer, torch.zeros_like(mask))
    assert empty == {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0}


def test_rejection_modes_drop_tokens_from_the_actor_loss_and_its_normaliser():
    """rollout_correction token_mask: a rejected token leaves the actor's loss mask (verl's rule), so the policy loss
    at ratio 1 is the mean over the kept tokens only; token_tis gives weights and no mask."""
    from ragen.algorithms.losses import aggregate_loss
    from ragen.algorithms.rollout_correction import RolloutCorrectionConfig
    from ragen.trainer.credit import rollout_correction, to_train_batch

    batch = _batch([1.0, 0.0], group_size=2)
    engine = torch.zeros(2, 6)
    engine[0, 3] = -5.0  # ratio e^5 > high=2 on one token of row 0: rejected
    batch = dataclasses.replace(batch, sample_log_probs=engine)
    old = torch.zeros(2, 6)
    masked = rollout_correction(RolloutCorrectionConfig(mode="token_mask"), batch, old)
    assert masked.is_weights is None and masked.metrics["rollout_correction/masked_frac"] == pytest.approx(1 / 6)
    tb = to_train_batch(batch).with_fields(keep_mask=masked.keep_mask)
    assert tb.actor_mask.tolist() == [[0, 0, 1, 0, 1, 0], [0, 0, 1, 1, 1, 0]]
    adv = torch.arange(12, dtype=torch.float).view(2, 6)
    kept = adv[tb.actor_mask.bool()]
    assert float(aggregate_loss(-adv, tb.actor_mask)) == pytest.approx(float(-kept.sum() / 5))  # 5 kept, not 6
    tis = rollout_correction(RolloutCorrectionConfig(mode="token_tis"), batch, old)
    assert tis.keep_mask is None and float(tis.is_weights[0, 3]) == pytest.approx(2.0)
