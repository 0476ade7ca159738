"""The actor's collapse probe (``PolicyWorker.collapse_cross``) and the trainer's collapse metrics over it
(``ragen.trainer.collapse``): the worker scores same-turn pairs with its own forward at the sampling temperature
(equal to the plain builder over the same weights), and a scripted policy that copies its observation reads
(MI ~ log N, retrieval 1) where one that ignores it does not (MI 0, retrieval at chance), with failed and context-cut
rows left out of the sample."""

from __future__ import annotations

import math

import pytest
import torch
from factories import rollout_batch
from torch import nn
from transformers import AutoModelForCausalLM

from ragen.trainer.collapse import collapse_due, collapse_sample, collapse_step_metrics
from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker
from ragen.workers.collapse_probe import cross_log_probs, lm_log_prob_fn

VOCAB = 300  # the scripted policies' vocabulary


def actor(model_dir: str, **cfg) -> LocalWorkerGroup:
    base = {"mini_batch_size": 4, "micro_batch_size": 2, "mixed_precision": "fp32"}
    return LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=ActorConfig(**{**base, **cfg}))


def test_worker_scores_same_turn_pairs_with_its_forward(model_dir):
    prompts = [[1, 40, 41, 42], [1, 50], [1, 60, 61], [1, 70, 71, 72, 73], [1, 80]]
    responses = [[100, 101], [102], [103, 104, 105], [106, 2], [107, 108]]
    turns = [0, 0, 1, 1, 1]
    group = actor(model_dir, temperature=0.7, infer_micro_batch_size=3)
    cross = group.call_rank0("collapse_cross", prompts, responses, turns, 0)
    same = torch.tensor(turns)[:, None] == torch.tensor(turns)[None, :]
    assert cross.shape == (5, 5) and bool(torch.isnan(cross[~same]).all())
    lm = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ref = cross_log_probs(lm_log_prob_fn(lm, temperature=0.7), prompts, responses, batch_size=64)
    torch.testing.assert_close(cross[same], ref[same], atol=1e-4, rtol=1e-5)
    plain = cross_log_probs(lm_log_prob_fn(lm, temperature=1.0), prompts, responses, batch_size=64)
    assert float((plain[same] - cross[same]).abs().max()) > 0.1  # the temperature is applied, not 1


class ScriptedPolicy(nn.Module):
    """A ``LogProbModel`` stand-in: each model token of a turn is that turn's observation (the token just before its
    first model token) with probability ``copy_prob``, any other of ``VOCAB`` tokens uniformly; copy_prob = 1/VOCAB
    ignores the observation (every token equally likely)."""

    def __init__(self, copy_prob: float) -> None:
        super().__init__()
        self.copy_prob = copy_prob

    def forward(self, input_ids, attention_mask, target_mask=None, temperature=1.0, chunk_size=1024,
                with_entropy=False, checkpoint=True, with_values=False):
        first = target_mask.float().argmax(dim=1)
        obs = input_ids.gather(1, (first - 1).clamp(min=0)[:, None])
        other = math.log((1 - self.copy_prob) / (VOCAB - 1))
        lp = torch.where(input_ids == obs, math.log(self.copy_prob), other)
        return lp * target_mask, None


def two_turn_rollout() -> tuple:
    """Nine two-turn episodes: rows 0-5 each see their own observations (100 + i, then 200 + i) and answer them
    (copying); row 6 failed, row 7 had its history cut (both must stay out), row 8 replays row 0's seed (same
    prompts: one distinct prompt)."""
    rows = []
    for i in range(9):
        o1, o2 = 100 + (0 if i == 8 else i), 200 + (0 if i == 8 else i)
        rows.append([([5, o1], -1), ([o1, o1], 0), ([o2], -1), ([o2], 1)])
    failed = [i == 6 for i in range(9)]
    cut = torch.tensor([i == 7 for i in range(9)])
    return rollout_batch(rows, [[0.0, 0.0]] * 9, failed=failed, context_cut=cut)


def copying_mi(n: int, length: int, copy_prob: float = 0.9) -> float:
    """Hand value of a copying policy's MI over n prompts with ``length``-token answers: each column holds the own
    prompt's ``length * log(copy_prob)`` and n - 1 entries ``length * log((1 - copy_prob) / (VOCAB - 1))``."""
    own, other = length * math.log(copy_prob), length * math.log((1 - copy_prob) / (VOCAB - 1))
    return own - math.log((math.exp(own) + (n - 1) * math.exp(other)) / n)


@pytest.mark.parametrize(("copy_prob", "reads"), [(0.9, True), (1 / VOCAB, False)])
def test_copying_policy_reads_and_blind_one_does_not(model_dir, copy_prob, reads):
    group = actor(model_dir)
    group.worker.module = ScriptedPolicy(copy_prob)
    m = collapse_step_metrics(group, two_turn_rollout(), prompts_per_turn=8, pad_id=0)
    n = 6  # rows 0-5: the failed, the cut and the replayed rows are left out
    assert m["collapse/n_responses"] == 2 * n and m["collapse/chance_acc"] == pytest.approx(1 / n)
    hand = {"collapse/turn_0": copying_mi(n, 2), "collapse/turn_1": copying_mi(n, 1)}
    hand["collapse"] = (hand["collapse/turn_0"] + hand["collapse/turn_1"]) / 2  # n responses per turn
    for prefix in ("collapse", "collapse/turn_0", "collapse/turn_1"):
        if reads:
            assert m[f"{prefix}/mi"] == pytest.approx(hand[prefix], abs=1e-5)
            assert m[f"{prefix}/mi"] > math.log(n) - 0.002
            assert m[f"{prefix}/retrieval_acc"] == 1.0
        else:
            assert m[f"{prefix}/mi"] == pytest.approx(0.0, abs=1e-6)
            assert m[f"{prefix}/retrieval_acc"] == pytest.approx(1 / n)
    assert m["collapse/mi_bound"] == pytest.approx(math.log(n))


def test_turn_rows_with_cut_history_are_scored():
    """A turn-layout row is the exact prompt the policy saw, so a cut history does not leave it out (a trajectory
    row with a cut history is not what the policy saw, and is left out)."""
    rows = [[([5, 100 + i], -1), ([100 + i], 0)] for i in range(3)]
    cut = torch.tensor([False, True, False])
    turn_rows = rollout_batch(rows, [[0.0]] * 3, turn_rows=([0, 1, 2], [0, 0, 0]), context_cut=cut)
    trajectory = rollout_batch(rows, [[0.0]] * 3, context_cut=cut)
    assert [p.row for p in collapse_sample(turn_rows, 8)] == [0, 1, 2]
    assert [p.row for p in collapse_sample(trajectory, 8)] == [0, 2]


def test_sample_limit_and_schedule(model_dir):
    group = actor(model_dir)
    group.worker.module = ScriptedPolicy(0.9)
    m = collapse_step_metrics(group, two_turn_rollout(), prompts_per_turn=4, pad_id=0)
    assert m["collapse/turn_0/n_responses"] == 4 and m["collapse/chance_acc"] == 0.25
    assert m["collapse/mi"] == pytest.approx((copying_mi(4, 2) + copying_mi(4, 1)) / 2, abs=1e-5)
    one_prompt = rollout_batch([[([5, 9], -1), ([9], 0)]] * 3, [[0.0]] * 3)  # nothing to compare
    assert collapse_step_metrics(group, one_prompt, prompts_per_turn=8, pad_id=0) == {"collapse/n_responses": 0.0}
    assert [s for s in range(1, 25) if collapse_due(s, 10)] == [1, 11, 21]
    assert not any(collapse_due(s, 0) for s in range(1, 5)) and all(collapse_due(s, 1) for s in range(1, 5))
