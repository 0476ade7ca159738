"""Position-id packing (ragen.models.packing, the layout of ``flash_attention_2``): the plan by hand, its positions as
transformers reads them, and log-probs, entropy and values equal to the 4D-mask packing and to the unpacked batch
under ``sdpa`` and ``eager`` (fp32); the flash path hands the rows to a varlen kernel (a CPU stand-in for
flash-attn's, which checks what it is given, not flash-attn's numerics); the workers load their models with
``model.attn_implementation``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.masking_utils import find_packed_sequence_indices
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from worker_helpers import make_lm

import ragen.models.forward as forward_mod
import ragen.models.packing as packing
from ragen.models.packing import MASK, POSITION_IDS, plan_packing, plan_position_packing
from ragen.models.value_head import ValueModel
from ragen.workers.logprob import token_log_probs

ATOL, RTOL = 1e-5, 1e-4  # fp32: only the order of float sums differs between the layouts


def padded(rows: list[list[int]], left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        span = slice(T - len(r), T) if left else slice(0, len(r))
        ids[i, span] = torch.tensor(r, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


def group_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch as the trainer packs it: two episode groups of 3 rows, each group repeating its prompt (a shared
    system prefix of 20 tokens + 20 tokens of its own), every row with its own response length, right-padded."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(3, 1000, (20,), generator=g).tolist()
    prompts = [system + torch.randint(3, 1000, (20,), generator=g).tolist() for _ in range(2)]
    lengths = [(3, 17, 30), (1, 9, 24)]
    rows = [p + torch.randint(3, 1000, (n,), generator=g).tolist()
            for p, ns in zip(prompts, lengths, strict=True) for n in ns]
    return padded(rows)


def test_position_plan_by_hand():
    right, rmask = padded([[5, 6, 7], [8, 9]])
    left, lmask = padded([[5, 6, 7], [8, 9]], left=True)
    for ids, mask in ((right, rmask), (left, lmask)):
        plan = plan_position_packing(ids, mask)
        assert plan.ids.tolist() == [[5, 6, 7, 8, 9]]
        assert plan.positions.tolist() == [[0, 1, 2, 0, 1]]  # restart at 0 per row, left or right padding
        assert plan.mask is None and plan.shared == 0
        assert plan.cu_seqlens.tolist() == [0, 3, 5] and plan.cu_seqlens.dtype == torch.int32 and plan.max_len == 3
    assert plan_position_packing(right, rmask).index.tolist() == [[0, 1, 2], [3, 4, 0]]
    assert plan_position_packing(left, lmask).index.tolist() == [[0, 1, 2], [0, 3, 4]]
    # an empty row contributes nothing; a one-token row is a sequence of its own at position 0
    ids, mask = padded([[4], [], [5, 6]])
    plan = plan_position_packing(ids, mask)
    assert plan.ids.tolist() == [[4, 5, 6]] and plan.positions.tolist() == [[0, 0, 1]]
    assert plan.cu_seqlens.tolist() == [0, 1, 3] and plan.index.tolist() == [[0, 0], [0, 0], [1, 2]]
    full = torch.ones(2, 3, dtype=torch.long)
    assert plan_position_packing(full * 7, full) is None  # no padding to drop: the batch runs as it is
    assert plan_position_packing(full, full * 0) is None  # no real token


def test_transformers_reads_the_rows_from_the_positions():
    """transformers 5.x finds packed rows where a position does not follow its predecessor by one (sdpa / eager
    masks) and where it is 0 (flash-attn's cu_seqlens): both give exactly our rows."""
    ids, mask = group_batch()
    plan = plan_position_packing(ids, mask)
    lengths = mask.sum(1)
    rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    assert find_packed_sequence_indices(plan.positions)[0].tolist() == rows.tolist()
    (cu_q, cu_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(plan.positions)
    assert cu_q.tolist() == cu_k.tolist() == plan.cu_seqlens.tolist()
    assert int(max_q) == plan.max_len == int(lengths.max())


def _outputs(lm, critic, ids, mask) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        lp, ent = token_log_probs(lm, ids, mask, with_entropy=True)
        values, last = critic(ids, mask)
    return lp, ent, values, last


def _models(attn: str):
    lm = make_lm(seed=3)
    lm.config._attn_implementation = attn
    torch.manual_seed(0)
    critic = ValueModel(make_lm(seed=4).model, head_init_std=0.5)
    critic.backbone.config._attn_implementation = attn
    return lm, critic


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_position_packing_equals_mask_packing_and_unpacked(monkeypatch, attn):
    ids, mask = group_batch()
    lm, critic = _models(attn)
    plans = []
    real_plan = forward_mod.plan_packing
    monkeypatch.setattr(forward_mod, "plan_packing", lambda *a: plans.append(real_plan(*a)) or plans[-1])

    monkeypatch.setitem(packing.PACKING_BY_ATTENTION, attn, MASK)
    by_mask = _outputs(lm, critic, ids, mask)
    assert len(plans) == 2 and all(p is not None and p.mask is not None for p in plans)  # both shared-prefix packed
    monkeypatch.setitem(packing.PACKING_BY_ATTENTION, attn, POSITION_IDS)
    by_position = _outputs(lm, critic, ids, mask)
    assert len(plans) == 4 and all(p is not None and p.mask is None for p in plans[2:])  # both position-id packed
    monkeypatch.setattr(forward_mod, "plan_packing", lambda *a: None)
    unpacked = _outputs(lm, critic, ids, mask)

    lp = unpacked[0]
    assert float(lp.abs().sum()) > 0 and float(unpacked[2].abs().max()) > 0.1
    names = ("log-probs", "entropy", "values", "last values")
    for name, ref, a, b in zip(names, unpacked, by_mask, by_position, strict=True):
        torch.testing.assert_close(a, ref, atol=ATOL, rtol=RTOL, msg=f"4D mask {name}")
        torch.testing.assert_close(b, ref, atol=ATOL, rtol=RTOL, msg=f"position ids {name}")

    # control: positions running on across rows join them into one sequence, and the numbers move
    def joined(ids, mask):
        plan = plan_position_packing(ids, mask)
        return packing.PackPlan(plan.ids, torch.arange(plan.ids.shape[1])[None], None, plan.index, 0)

    monkeypatch.setattr(forward_mod, "plan_packing", lambda ids, mask, impl: joined(ids, mask))
    wrong = _outputs(lm, critic, ids, mask)
    assert float((wrong[0] - lp).abs().max()) > 1e-2


def test_left_padded_rows_pack_by_position(monkeypatch):
    ids, mask = group_batch(seed=1)
    ids, mask = torch.stack([r.roll(int((m == 0).sum())) for r, m in zip(ids, mask, strict=True)]), \
        torch.stack([m.roll(int((m == 0).sum())) for m in mask])
    assert mask[:, -1].all() and not mask[:, 0].all()  # left-padded
    lm, critic = _models("sdpa")
    monkeypatch.setitem(packing.PACKING_BY_ATTENTION, "sdpa", POSITION_IDS)
    assert plan_packing(ids, mask, "sdpa") is not None
    by_position = _outputs(lm, critic, ids, mask)
    monkeypatch.setattr(forward_mod, "plan_packing", lambda *a: None)
    unpacked = _outputs(lm, critic, ids, mask)  # the 2D-mask path
    for ref, got in zip(unpacked, by_position, strict=True):
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=RTOL)


def _varlen_stand_in(calls: list):
    """A CPU stand-in for transformers' flash_attention_2 function: causal attention within each sequence that
    ``cu_seq_lens_q`` delimits (the varlen kernel's contract), recording what it was handed."""

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        calls.append({"mask": attention_mask, "cu": kwargs.get("cu_seq_lens_q"), "cu_k": kwargs.get("cu_seq_lens_k"),
                      "max": kwargs.get("max_length_q"), "positions": kwargs.get("position_ids")})
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        cu = kwargs["cu_seq_lens_q"].tolist()
        out = torch.cat([F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e],
                                                        is_causal=True, scale=scaling)
                         for s, e in zip(cu[:-1], cu[1:], strict=True)], dim=2)
        return out.transpose(1, 2).contiguous(), None

    return attend


def test_flash_path_hands_the_rows_to_the_varlen_kernel(monkeypatch):
    ids, mask = group_batch(seed=2)
    ref_lm, ref_critic = _models("sdpa")
    reference = _outputs(ref_lm, ref_critic, ids, mask)
    calls: list = []
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "flash_attention_2", _varlen_stand_in(calls))
    lm, critic = _models("flash_attention_2")
    got = _outputs(lm, critic, ids, mask)
    lengths = mask.sum(1)
    expected_cu = [0] + torch.cumsum(lengths, 0).tolist()
    layers = lm.config.num_hidden_layers
    assert len(calls) == 2 * layers  # every layer of the policy and of the critic
    for c in calls:
        assert c["mask"] is None  # no 4D mask: the rows are delimited by cu_seqlens and positions
        assert c["cu"].tolist() == c["cu_k"].tolist() == expected_cu and c["cu"].dtype == torch.int32
        assert c["max"] == int(lengths.max())
        assert c["positions"].tolist() == [[p for n in lengths.tolist() for p in range(n)]]
    for ref, out in zip(reference, got, strict=True):
        torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("value", ["auto", "eager"])
def test_workers_load_their_models_with_it(model_dir, value):
    from ragen.workers import ActorConfig, CriticConfig, CriticWorker, PolicyWorker

    cfg = ActorConfig(mini_batch_size=2, micro_batch_size=2)
    actor = PolicyWorker(model_dir, cfg, role="ref", attn_implementation=value)
    critic = CriticWorker(model_dir, CriticConfig(mini_batch_size=2, micro_batch_size=2), attn_implementation=value)
    expected = "sdpa" if value == "auto" else value  # auto on a CPU: sdpa
    assert actor.attn_implementation == critic.attn_implementation == expected
    assert actor.module.lm.config._attn_implementation == expected
    assert critic.module.backbone.config._attn_implementation == expected


def test_flash_path_gradients_under_gradient_checkpointing(monkeypatch):
    """The rows' boundaries reach the kernel again when checkpointed layers recompute in backward; the gradients
    equal sdpa's."""
    ids, mask = group_batch(seed=3)
    calls: list = []
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "flash_attention_2", _varlen_stand_in(calls))
    grads = []
    for attn in ("sdpa", "flash_attention_2"):
        lm = make_lm(seed=3)
        lm.config._attn_implementation = attn
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.train()
        lp, _ = token_log_probs(lm, ids, mask)
        (lp * torch.linspace(0.5, 1.5, lp.numel()).view_as(lp)).sum().backward()
        grads.append({n: p.grad for n, p in lm.named_parameters()})
    assert len(calls) == 2 * lm.config.num_hidden_layers  # forward and the recomputation in backward
    for name, ref in grads[0].items():
        torch.testing.assert_close(grads[1][name], ref, atol=ATOL, rtol=RTOL, msg=name)
