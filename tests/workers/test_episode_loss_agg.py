"""The ``seq-mean-*`` loss aggregations average over episodes in both layouts: the ``turn`` layout's turn rows of one
episode form one sequence (``TrainBatch.seq_ids``), so an update on the turn rows of some episodes gives the loss of
the same episodes as trajectory rows."""

from __future__ import annotations

import pytest
import torch

from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.config import LOSS_AGG

# Episode A: prompt, turn 0 (3 tokens), observation, turn 1 (2 tokens); episode B: prompt, one turn of 4 tokens.
PA, A0, OA, A1 = [5, 6, 7], [30, 31, 32], [8, 9], [33, 34]
PB, B0 = [5, 6, 11], [40, 41, 42, 43]


def _rows(parts: list[list[tuple[list[int], bool]]]) -> TrainBatch:
    """Right-padded rows from (ids, is_model_token) segments, advantages = 0.1 * token id on model tokens."""
    width = max(sum(len(ids) for ids, _ in row) for row in parts)
    n = len(parts)
    ids, att, resp = (torch.zeros(n, width, dtype=torch.long) for _ in range(3))
    for i, row in enumerate(parts):
        pos = 0
        for seg, model in row:
            ids[i, pos:pos + len(seg)] = torch.tensor(seg)
            att[i, pos:pos + len(seg)] = 1
            resp[i, pos:pos + len(seg)] = int(model)
            pos += len(seg)
    return TrainBatch(ids, att, resp, advantages=0.1 * ids.float() * resp)


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

