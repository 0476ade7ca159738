"""The cross log-prob matrix from a model (ragen.workers.collapse_probe): batched and right-padded, it equals a plain
loop scoring each (prompt, response) pair alone with the tiny model; pair masks score only what they name; a
scripted copying scorer pushed through the builder reads its prompts (MI ~ log N), a blind one does not."""

from __future__ import annotations

import math

import pytest
import torch

from ragen.algorithms.collapse import TurnPair, collapse_metrics, collapse_metrics_by_turn
from ragen.models import tiny_model
from ragen.workers.collapse_probe import cross_log_probs, lm_log_prob_fn, probe_turn_pairs

PROMPTS = [[1, 40, 41, 42], [1, 50], [1, 60, 61], [1, 70, 71, 72, 73]]
RESPONSES = [[100, 101], [102], [103, 104, 105], [106, 2]]


@pytest.fixture(scope="module")
def model(default_tokenizer):
    return tiny_model(tokenizer=default_tokenizer, seed=0).eval()


def plain_cross(model, prompts, responses, temperature=1.0):
    """cross[i, j] by one unpadded forward per pair: sum over response tokens of log_softmax(logits / T)."""
    cross = torch.zeros(len(prompts), len(responses), dtype=torch.float64)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            for j, r in enumerate(responses):
                ids = torch.tensor([p + r])
                logp = torch.log_softmax(model(input_ids=ids).logits[0].double() / temperature, dim=-1)
                cross[i, j] = sum(float(logp[len(p) - 1 + t, tok]) for t, tok in enumerate(r))
    return cross


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_matches_a_plain_loop(model, batch_size):
    ref = plain_cross(model, PROMPTS, RESPONSES, temperature=0.7)
    cross = cross_log_probs(lm_log_prob_fn(model, temperature=0.7), PROMPTS, RESPONSES, batch_size=batch_size)
    assert cross.shape == (4, 4) and cross.dtype == torch.float32
    torch.testing.assert_close(cross.double(), ref, atol=1e-4, rtol=1e-5)


def test_pair_mask_and_turn_probe(model):
    turn = torch.tensor([0, 0, 1, 1])
    mask = turn[:, None] == turn[None, :]
    calls = []

    def counting(ids, attn, target):
        calls.append(ids.shape[0])
        return lm_log_prob_fn(model)(ids, attn, target)

    cross = cross_log_probs(counting, PROMPTS, RESPONSES, batch_size=3, pair_mask=mask)
    assert sum(calls) == 8 and calls == [3, 3, 2]  # only the 2 x 2 + 2 x 2 same-turn pairs
    assert bool(torch.isnan(cross[~mask]).all())
    ref = plain_cross(model, PROMPTS, RESPONSES)
    torch.testing.assert_close(cross[mask].double(), ref[mask], atol=1e-4, rtol=1e-5)
    pairs = [TurnPair(row=r, turn=int(turn[r]), prompt=PROMPTS[r], response=RESPONSES[r]) for r in range(4)]
    probed = probe_turn_pairs(lm_log_prob_fn(model), pairs, batch_size=5)
    expected = collapse_metrics_by_turn(ref, turn, response_lengths=torch.tensor([2, 1, 3, 2]))
    assert probed.overall.mi == pytest.approx(expected.overall.mi, abs=1e-4)
    assert probed.overall.mi_per_token == pytest.approx(expected.overall.mi_per_token, abs=1e-4)
    assert probed.per_turn[1].retrieval_acc == expected.per_turn[1].retrieval_acc


def scripted_scorer(copy_prob: float, vocab: int):
    """A LogProbFn of a policy over ``vocab`` tokens that emits the observation (the prompt's first token) with
    probability ``copy_prob`` per token and any other token uniformly; copy_prob = 1/vocab ignores the prompt."""
    other = math.log((1 - copy_prob) / (vocab - 1))

    def score(ids, attn, target):
        copy = ids == ids[:, :1]
        return torch.where(copy, math.log(copy_prob), other) * target

    return score


def test_builder_with_scripted_policies():
    N = 8
    prompts = [[t] for t in range(N)]  # distinct observations
    copies = [[t, t, t] for t in range(N)]  # what the copying policy answers
    reading = collapse_metrics(cross_log_probs(scripted_scorer(0.9, N), prompts, copies, batch_size=5))
    assert reading.mi == pytest.approx(math.log(N), abs=0.01) and reading.retrieval_acc == 1.0
    blind = collapse_metrics(cross_log_probs(scripted_scorer(1 / N, N), prompts, copies, batch_size=5))
    assert blind.mi == pytest.approx(0.0, abs=1e-6) and blind.retrieval_acc == pytest.approx(1 / N)


def test_refusals():
    with pytest.raises(ValueError, match="at least one token"):
        cross_log_probs(scripted_scorer(0.5, 4), [[]], [[1]])
    with pytest.raises(ValueError, match="pair_mask"):
        cross_log_probs(scripted_scorer(0.5, 4), [[1]], [[1]], pair_mask=torch.ones(2, 2, dtype=torch.bool))
