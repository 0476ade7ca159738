"""TrainBatch slicing helpers, config validation messages and the lr schedule."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from ragen.workers.config import ActorConfig, CriticConfig
from ragen.workers.data import TrainBatch
from ragen.workers.group import combine
from ragen.workers.trainable import lr_multiplier


def _batch(B=6, T=5):
    ids = torch.arange(B * T).view(B, T)
    attn = torch.ones(B, T, dtype=torch.long)
    attn[:, 3:] = 0
    return TrainBatch(ids, attn, attn.clone(), advantages=ids.float())


def test_split_chunk_select_cat_trim():
    b = _batch()
    parts = b.split(3)
    assert [p.batch_size for p in parts] == [2, 2, 2]
    assert torch.equal(parts[1].input_ids, b.input_ids[2:4]) and torch.equal(parts[2].advantages, b.advantages[4:])
    assert [c.batch_size for c in b.chunk(4)] == [4, 2]
    assert torch.equal(TrainBatch.cat(parts).input_ids, b.input_ids)
    assert torch.equal(b.select([5, 0]).input_ids[:, 0], torch.tensor([25, 0]))
    t = b.trim()
    assert t.seq_len == 3 and torch.equal(t.advantages, b.advantages[:, :3]) and t.old_log_probs is None
    assert b.policy_mask is b.response_mask
    assert b.with_fields(loss_mask=torch.zeros(6, 5)).policy_mask.sum() == 0
    assert torch.equal(pickle.loads(pickle.dumps(b)).advantages, b.advantages)
    with pytest.raises(ValueError, match="multiple of 4"):
        b.split(4)


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="advantages has shape"):
        TrainBatch(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), advantages=torch.zeros(2, 4))


def test_combine_results():
    assert torch.equal(combine([torch.zeros(1, 2), torch.ones(2, 2)]), torch.tensor([[0.0, 0], [1, 1], [1, 1]]))
    assert combine([{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 2.0}]) == {"a": 2.0, "b": 2.0}
    assert combine([None, None]) is None and combine(["x", "y"]) == ["x", "y"]


@pytest.mark.parametrize("kwargs,match", [
    ({"lr_schedule": "linear"}, "actor.lr_schedule='linear' is unknown"),
    ({"lr_schedule": "cosine", "total_steps": 0}, "needs actor.total_steps >= 1"),
    ({"dual_clip": 1.0}, "actor.dual_clip=1.0 must be > 1"),
    ({"kl_kind": "k9"}, "actor.kl_kind='k9'"),
    ({"loss_agg": "mean"}, "actor.loss_agg='mean'"),
    ({"micro_batch_size": 0}, "actor.micro_batch_size=0"),
    ({"mixed_precision": "fp16"}, "actor.mixed_precision='fp16'"),
    ({"temperature": 0.0}, "actor.temperature=0.0"),
])
def test_actor_config_messages(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActorConfig(**kwargs)


def test_critic_config_and_betas_from_yaml_list():
    with pytest.raises(ValueError, match="critic.value_clip=0"):
        CriticConfig(value_clip=0)
    assert ActorConfig(betas=[0.9, 0.95]).betas == (0.9, 0.95)


def test_lr_multiplier_hand_values():
    kw = {"warmup_steps": 4, "total_steps": 12, "min_lr_ratio": 0.1}
    assert [lr_multiplier(s, schedule="constant", **kw) for s in (0, 1, 3, 4, 100)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert lr_multiplier(4, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_multiplier(8, schedule="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_multiplier(12, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_multiplier(50, schedule="cosine", **kw) == pytest.approx(0.1)


def test_shard_rows_forms_global_mini_batches_first():
    """Rank r gets its share of every global mini-batch, so each rank's i-th local mini-batch is part of the i-th
    world-size-1 mini-batch; without a dividing mini-batch size the parts are consecutive."""
    from ragen.workers.data import shard_rows

    rows = [r.tolist() for r in shard_rows(8, 2, 4)]
    assert rows == [[0, 1, 4, 5], [2, 3, 6, 7]]  # mini-batch 0 = rows 0-3 (ranks 0, 1), mini-batch 1 = rows 4-7
    assert [r.tolist() for r in shard_rows(12, 3, 6)] == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]]
    for mb in (8, None, 3, 5):  # one mini-batch / none given / not dividing: consecutive parts
        assert [r.tolist() for r in shard_rows(8, 2, mb)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="multiple of 3"):
        shard_rows(8, 3, 4)


def test_group_split_and_combine_keep_row_order():
    """What the ranks return comes back in the batch's row order (tensors and tuples of tensors)."""
    from ragen.workers.group import _split

    b = _batch(B=8)
    parts, rows = _split(b, 2, mini_batch_size=4)
    assert [p.input_ids[:, 0].tolist() for p in parts] == [[0, 5, 20, 25], [10, 15, 30, 35]]
    per_rank = [p.input_ids.float() * 2 for p in parts]
    assert torch.equal(combine(per_rank, rows), b.input_ids.float() * 2)
    vals, last = combine([(p.advantages, p.input_ids[:, 0]) for p in parts], rows)
    assert torch.equal(vals, b.advantages) and torch.equal(last, b.input_ids[:, 0])


def test_trainable_cosine_needs_total_steps():
    """A cosine schedule without a horizon would decay within one step: the worker refuses it, naming the fix
    (the trainer passes the total derived from trainer.total_steps)."""
    from types import SimpleNamespace

    from ragen.workers.trainable import Trainable

    cfg = SimpleNamespace(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, warmup_steps=0,
                          lr_schedule="cosine", total_steps=None, min_lr_ratio=0.0)
    with pytest.raises(ValueError, match=r"actor.total_steps >= 1 .* derives it from trainer.total_steps"):
        Trainable(torch.nn.Linear(2, 2), cfg, torch.device("cpu"), 1, "actor")
    ok = SimpleNamespace(**{**vars(cfg), "total_steps": 4})
    assert Trainable(torch.nn.Linear(2, 2), ok, torch.device("cpu"), 1, "actor").scheduler.get_last_lr()[0] == 1e-3
