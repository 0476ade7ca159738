"""Shared-prefix packing (ragen.models.packing): the plan by hand, and the packed forward/backward equal to the
unpacked one for log-probs, values and every parameter's gradient."""

import pytest
import torch

import ragen.models.forward as forward_mod
from ragen.models import tiny_model
from ragen.models.packing import MIN_SHARED, plan_packing, shared_prefix_len
from ragen.models.value_head import ValueModel
from ragen.workers.logprob import token_log_probs


def right_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def test_plan_by_hand(monkeypatch):
    monkeypatch.setattr("ragen.models.packing.MIN_SHARED", 2)
    ids, mask = right_padded([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 1, 2]])
    plan = plan_packing(ids, mask, "sdpa")
    # shared prefix [5, 6] (row 1 differs at position 2), then row 0: [7, 8], row 1: [9], row 2: [7, 1, 2]
    assert plan.shared == 2
    assert plan.ids.tolist() == [[5, 6, 7, 8, 9, 7, 1, 2]]
    assert plan.positions.tolist() == [[0, 1, 2, 3, 2, 2, 3, 4]]
    assert plan.index.tolist() == [[0, 1, 2, 3, 0], [0, 1, 4, 0, 0], [0, 1, 5, 6, 7]]
    allowed = plan.mask[0, 0].long().tolist()
    assert allowed[4] == [1, 1, 0, 0, 1, 0, 0, 0]  # row 1's token 9 sees the prefix and itself only
    assert allowed[7] == [1, 1, 0, 0, 0, 1, 1, 1]  # row 2's last token: prefix + its own earlier tokens
    assert allowed[1] == [1, 1, 0, 0, 0, 0, 0, 0]  # the prefix is causal


def test_shared_prefix_len_keeps_a_token_per_row():
    ids, mask = right_padded([[1, 2, 3], [1, 2, 3, 4]])
    assert shared_prefix_len(ids, mask.sum(1)) == 2
    ids, mask = right_padded([[1, 2, 3], [4, 2, 3]])
    assert shared_prefix_len(ids, mask.sum(1)) == 0


def batch_with_prefix(prefix_len: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, 1000, (prefix_len,), generator=g).tolist()
    rows = [prefix + torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 12, 1, 30)]
    return right_padded(rows)


def test_when_packing_applies():
    ids, mask = batch_with_prefix()
    assert plan_packing(ids, mask, "sdpa") is not None and plan_packing(ids, mask, "eager") is not None
    assert plan_packing(ids, mask, "flash_attention_2").mask is None  # no 4D masks there: position-id packing
    assert plan_packing(ids[:1], mask[:1], "sdpa") is None  # one row: nothing to share
    left = torch.flip(mask, dims=[1])
    assert plan_packing(torch.flip(ids, dims=[1]), left, "sdpa") is None  # left padding: not packed
    short, smask = batch_with_prefix(prefix_len=MIN_SHARED - 1)
    assert plan_packing(short, smask, "sdpa") is None


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_unpacked_log_probs_values_and_gradients(default_tokenizer, monkeypatch, attn):
    ids, mask = batch_with_prefix()
    lm = tiny_model(tokenizer=default_tokenizer, seed=0)
    lm.config._attn_implementation = attn
    torch.manual_seed(0)
    critic = ValueModel(tiny_model(tokenizer=default_tokenizer, seed=1).model, head_init_std=0.5)
    critic.backbone.config._attn_implementation = attn
    weights = torch.rand(ids.shape)

    def run() -> tuple[torch.Tensor, torch.Tensor, dict, dict]:
        lp, _ = token_log_probs(lm, ids, mask)
        (lp * weights).sum().backward()
        values, last = critic(ids, mask)
        ((values * weights).sum() + last.sum()).backward()
        return lp.detach(), values.detach(), grads(lm), grads(critic)

    calls = []
    real_plan = forward_mod.plan_packing
    monkeypatch.setattr(forward_mod, "plan_packing", lambda *a: calls.append(real_plan(*a)) or calls[-1])
    lp_p, v_p, g_lm_p, g_cr_p = run()
    assert len(calls) == 2 and all(c is not None for c in calls)  # both passes were packed
    monkeypatch.setattr(forward_mod, "plan_packing", lambda *a: None)
    lp_u, v_u, g_lm_u, g_cr_u = run()
    torch.testing.assert_close(lp_p, lp_u, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(v_p, v_u, atol=1e-5, rtol=1e-4)
    assert lp_u.abs().sum() > 0 and v_u.abs().sum() > 0
    for ref, got in ((g_lm_u, g_lm_p), (g_cr_u, g_cr_p)):
        assert ref.keys() == got.keys() and len(ref) > 0
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], atol=1e-4, rtol=1e-3, msg=name)
