"""The ``seq-mean-*`` loss aggregations average over episodes in both layouts: the ``turn`` layout's turn rows of one
episode form one sequence (``TrainBatch.seq_ids``), so an update on the turn rows of some episodes gives the loss of
the same episodes as trajectory rows."""

from __future__ import annotations

import pytest
import torch
from factories import train_batch

from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.config import LOSS_AGG

# Episode A: prompt, turn 0 (3 tokens), observation, turn 1 (2 tokens); episode B: prompt, one turn of 4 tokens.
PA, A0, OA, A1 = [5, 6, 7], [30, 31, 32], [8, 9], [33, 34]
PB, B0 = [5, 6, 11], [40, 41, 42, 43]


def _rows(parts: list[list[tuple[list[int], bool]]]) -> TrainBatch:
    """Right-padded rows from (ids, is_model_token) segments, advantages = 0.1 * token id on model tokens."""
    batch = train_batch([[(seg, 0 if model else -1) for seg, model in row] for row in parts])
    return batch.with_fields(advantages=0.1 * batch.input_ids.float() * batch.response_mask)


TRAJECTORY = _rows([[(PA, False), (A0, True), (OA, False), (A1, True)], [(PB, False), (B0, True)]])
TURN = _rows([[(PA, False), (A0, True)], [(PA, False), (A0, False), (OA, False), (A1, True)],
              [(PB, False), (B0, True)]])


@pytest.mark.parametrize("agg", LOSS_AGG)
def test_turn_rows_of_an_episode_are_one_sequence(model_dir, agg):
    cfg = ActorConfig(lr=1e-3, mini_batch_size=2, micro_batch_size=1, mixed_precision="fp32", loss_agg=agg)
    losses = {}
    for name, batch in (("trajectory", TRAJECTORY), ("turn", TURN.with_fields(seq_ids=torch.tensor([0, 0, 1]))),
                        ("turn rows as sequences", TURN)):
        actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir,
                                 cfg=ActorConfig(**{**cfg.__dict__, "mini_batch_size": batch.batch_size}))
        batch = batch.with_fields(old_log_probs=actor.call("compute_log_probs", batch))
        losses[name] = actor.call("update", batch)["actor/pg_loss"]
    # ratio 1 at the first step: pg_loss = -sum_t w_t A_t with the aggregation's weights, hand-computed:
    a_tok, b_tok = [0.1 * t for t in A0 + A1], [0.1 * t for t in B0]
    expected = {"token-mean": -(sum(a_tok) + sum(b_tok)) / 9,
                "seq-mean-token-sum": -(sum(a_tok) + sum(b_tok)) / 2,
                "seq-mean-token-mean": -(sum(a_tok) / 5 + sum(b_tok) / 4) / 2}[agg]
    assert losses["trajectory"] == pytest.approx(expected, rel=1e-5)
    assert losses["turn"] == pytest.approx(expected, rel=1e-5)
    if agg != "token-mean":  # three turn rows counted as three sequences: another loss
        assert losses["turn rows as sequences"] != pytest.approx(expected, rel=1e-3)



def _episode_weights(model_dir: str, agg: str) -> list[float]:
    """Total weight of each of 4 episodes (3, 1, 2 and 1 turns, one model token per turn) in one update of two
    mini-batches of 4 rows: the factor on the episode's aggregate (its token sum or token mean), read off
    ``actor/pg_loss`` at ratio 1 with advantage 1 on that episode's tokens."""
    prompt, obs = [5, 6, 7], [8]
    turns = [3, 1, 2, 1]
    rows, seq = [], []
    for e, n in enumerate(turns):  # episode order; the group shares its first prompt, so turn 0 rows pack first
        history: list[tuple[list[int], bool]] = [(prompt, False)]
        for k in range(n):
            rows.append(history + [([20 + 3 * e + k], True)])
            seq.append(e)
            history = history + [([20 + 3 * e + k], False), (obs, False)]
    rows.append([([1], False)])  # a padding row: 8 rows, two mini-batches of 4
    seq.append(len(turns))
    batch = _rows(rows).with_fields(seq_ids=torch.tensor(seq))
    cfg = ActorConfig(lr=0.0, mini_batch_size=4, micro_batch_size=4, mixed_precision="fp32", loss_agg=agg)
    actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
    batch = batch.with_fields(old_log_probs=actor.call("compute_log_probs", batch))
    weights = []
    for e in range(len(turns)):
        adv = batch.response_mask.float() * (torch.tensor(seq) == e).float()[:, None]
        m = actor.call("update", batch.with_fields(advantages=adv))
        total = -2 * m["actor/pg_loss"]  # pg_loss is the mean over the 2 mini-batches
        weights.append(total / turns[e] if agg == "seq-mean-token-sum" else total)  # the episode's sum is n tokens
    return weights


@pytest.mark.parametrize("agg", ["seq-mean-token-sum", "seq-mean-token-mean"])
def test_an_episode_weighs_the_same_however_its_turn_rows_are_cut_into_mini_batches(model_dir, agg):
    # prompt order packs the group's turn-0 rows into the first mini-batch and the later turns of episodes 0 and 2
    # into the second: counting each piece as a sequence gave [0.75, 0.25, 0.75, 0.25]; the rule (a sequence is the
    # episode, 1 / N per sequence and mini-batch) gives every episode M / N = 2 / 4 over the update
    assert _episode_weights(model_dir, agg) == pytest.approx([0.5, 0.5, 0.5, 0.5], rel=1e-5)
