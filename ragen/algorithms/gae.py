"""GAE family: token GAE over model tokens, turn-level GAE, bi-level GAE and their weighted mix.

GAE: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
eq. 16: A_t = sum_l (gamma * lam)^l delta_{t+l}, delta_t = r_t + gamma * V_{t+1} - V_t.
Turn-level and bi-level (high level over turns, low level over tokens inside a turn) follow the
hierarchical scheme of ArCHer (Zhou et al. 2024) as written out in DESIGN.md.

All tensors are (B, T) unless noted; ``response_mask`` is 1 on model tokens; ``turn_ids`` is k on the model
tokens of turn k, -1 elsewhere; ``bootstrap`` (B,) is the value to bootstrap from after a row's last step
(V at the last non-pad token for truncated rows, 0 otherwise). Outputs are (adv, ret), exactly 0 off model
tokens, in the promoted dtype of rewards and values (at least float32); turn-level (B, K) work runs in float64.
``return_mode`` is "adv_plus_value" (ret = A + V) or "reward_to_go" (ret = discounted sum of future rewards,
token level for :func:`gae`, turn level with ``high_level_gamma`` for the turn methods; no bootstrap).
Off-mask entries of rewards and values must be finite: they only ever meet exact zeros, so they change nothing.

Two implementations: on CPU tensors each function hands the work to the fused C++ kernel of
:mod:`ragen.algorithms.fused` (one pass per row that also checks the turn-id contract) when it is built; the
tensor code below serves CUDA tensors and installs without the kernel, and both are tested against the loop
references. Cost of the tensor code: token-level work is a handful of elementwise passes plus one
:func:`chunked_scan` (a small matrix product per chunk); nothing gathers model tokens into a compacted copy.
Closed forms: with lam = 1 the value terms telescope (only rewards are scanned); bi-level with
gamma = lam = 1 is A_t = G_k - V_t (no scan).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algorithms import fused
from ragen.algorithms.scan import TurnView, chunked_scan, discounted_suffix_sum, run_view, shift_left, turn_view

RETURN_MODES = ("adv_plus_value", "reward_to_go")
_F64 = torch.float64


def _check_return_mode(return_mode: str) -> None:
    if return_mode not in RETURN_MODES:
        raise ValueError(f"return_mode={return_mode!r} is not one of {RETURN_MODES}")


def _out_dtype(*xs: Tensor) -> torch.dtype:
    dtype = torch.float32
    for x in xs:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype


def _boot(bootstrap: Tensor | None, B: int, device: torch.device) -> Tensor:
    return torch.zeros(B, dtype=_F64, device=device) if bootstrap is None else bootstrap.to(_F64)


def _put(x: Tensor, pos: Tensor, new: Tensor, where: Tensor) -> None:
    """In place: x[b, pos[b, k]] = new[b, k] where ``where[b, k]`` (only the selected entries are written)."""
    rows = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(pos)
    x[rows[where], pos[where]] = new[where].to(x.dtype)


def _next_step_values(v: Tensor, gamma: float, out: Tensor | None = None) -> Tensor:
    """(B, T): ``gamma * V_{j+1} - V_j`` (the last column gets ``-V``), written into ``out`` if given."""
    u = torch.empty_like(v) if out is None else out
    torch.neg(v[:, -1:], out=u[:, -1:])
    if gamma == 1.0:
        torch.sub(v[:, 1:], v[:, :-1], out=u[:, :-1])
    else:
        torch.mul(v[:, 1:], gamma, out=u[:, :-1]).sub_(v[:, :-1])
    return u


def _outputs(x: Tensor, v: Tensor, units: TurnView, out: Tensor) -> tuple[Tensor, Tensor]:
    """(adv, ret) = (x, x + V) on model tokens, 0 elsewhere; adv is written into ``out`` (a dead buffer), ret into
    x: no new (B, T) tensor."""
    adv = units.mask_(x, out=out)
    return adv, units.mask_(x.add_(v))


def _token_gae(
    r: Tensor, v: Tensor, units: TurnView, boot: Tensor, *, gamma: float, lam: float, skip_env_tokens: bool,
    return_mode: str,
) -> tuple[Tensor, Tensor]:
    """Token GAE given a view whose units (turns or runs) are contiguous model-token runs covering every model
    token. Only a unit's last token can have a next model token other than j + 1: the next unit's first token.

    With lam = 1 the value terms telescope: A_t = sum_{s >= t} gamma^(s-t) r_s + gamma^(n-t) * bootstrap - V_t,
    so only rewards are scanned (exact in float32 even undiscounted over 16k tokens, where summing per-token
    value differences would accumulate rounding).
    """
    if units.K == 0:  # no model tokens in the batch (or T = 0): nothing to estimate
        return torch.zeros_like(v), torch.zeros_like(v)
    model = units.model
    ex, first, last = units.exists, units.first_pos, units.last_pos
    n = units.num_turns
    has = (n > 0)[:, None]
    row_last = last.gather(1, (n - 1).clamp(min=0)[:, None])  # (B, 1) the row's last model token
    if skip_env_tokens:
        scan_kw = dict(steps=model, mark_pos=torch.cat([units.firsts_or_neg(), units.ends_or_neg()], dim=1))
    else:  # every position from the first model token to the last one is a step; cut after the last one
        scan_kw = dict(cut_pos=torch.where(has, row_last, -1))
    rewards = units.mask_(r, out=torch.empty_like(r))  # rewards on model tokens, 0 elsewhere
    if lam == 1.0:
        u = rewards.clone() if return_mode == "reward_to_go" else rewards
        _put(u, row_last, r.gather(1, row_last).to(_F64) + gamma * boot[:, None], has)
        x = chunked_scan(u, gamma, **scan_kw)  # A + V on the steps
        adv, ret = units.mask_(torch.sub(x, v, out=u)), units.mask_(x)
    else:
        r_end, v_end = r.gather(1, last).to(_F64), v.gather(1, last).to(_F64)
        u = _next_step_values(v, gamma).add_(rewards)
        if skip_env_tokens:
            nxt = units.set_last_turn(shift_left(v.gather(1, first).to(_F64) * ex), boot)  # V of the next step
            units.mask_(u)  # delta on model tokens, 0 elsewhere (those pass through)
            _put(u, last, r_end + gamma * nxt - v_end, ex)
        else:
            last_of = (n - 1).clamp(min=0)[:, None]
            _put(u, row_last, r_end.gather(1, last_of) + gamma * boot[:, None] - v_end.gather(1, last_of), has)
        adv, ret = _outputs(chunked_scan(u, gamma * lam, **scan_kw), v, units, out=u)
    if return_mode == "reward_to_go":
        ret = units.mask_(chunked_scan(rewards, gamma, **scan_kw))
    return adv, ret


def gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    skip_env_tokens: bool = True,
    bootstrap: Tensor | None = None,
    return_mode: str = "adv_plus_value",
    turn_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE.

    With ``skip_env_tokens`` the steps are the model tokens p_1 < ... < p_n only: the next value of p_i is
    V(p_{i+1}), env/pad tokens are neither steps nor bootstraps. Otherwise every position from p_1 to p_n is a
    step (env tokens carry reward 0). The step after the last one has value ``bootstrap`` (B,).
    ``turn_ids`` (B, T) is optional: turns do not change token GAE, but when given, the turn-id contract is
    checked in the same pass (fused kernel; the tensor code checks turn order and contiguity).
    """
    _check_return_mode(return_mode)
    dtype = _out_dtype(token_rewards, values)
    if fused.usable(token_rewards, values, response_mask, turn_ids):
        return fused.gae_family(
            "gae", token_rewards, values, response_mask, turn_ids, bootstrap, dtype=dtype, gamma=gamma, lam=lam,
            skip_env_tokens=skip_env_tokens, return_mode=return_mode,
        )
    # units: the turns, or the maximal runs of consecutive model tokens
    units = run_view(response_mask) if turn_ids is None else turn_view(turn_ids, response_mask)
    return _token_gae(
        token_rewards.to(dtype), values.to(dtype), units, _boot(bootstrap, units.model.shape[0], values.device),
        gamma=gamma, lam=lam, skip_env_tokens=skip_env_tokens, return_mode=return_mode,
    )


def _turn_level(
    token_rewards: Tensor,
    values: Tensor,
    tv: TurnView,
    *,
    high_level_gamma: float,
    high_level_lam: float,
    bootstrap: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """High-level GAE over turns. Returns (A^H, V(e_k), r_k), each (B, K) float64.

    delta_k = r_k + gamma_H * V(e_{k+1}) - V(e_k), with V(e_{n}) replaced by the bootstrap after the last turn;
    A^H_k = delta_k + gamma_H * lam_H * A^H_{k+1}. r_k sums the rewards on the model tokens of turn k.
    """
    r = tv.sum_tokens(token_rewards)
    v_end = tv.at_turn_end(values).to(_F64)
    next_v = tv.set_last_turn(shift_left(v_end), _boot(bootstrap, v_end.shape[0], v_end.device))
    delta = (r + high_level_gamma * next_v - v_end) * tv.exists
    adv_h = discounted_suffix_sum(delta, high_level_gamma * high_level_lam)
    return adv_h, v_end, r


def _turn_outputs(
    token_rewards: Tensor, values: Tensor, tv: TurnView, *, high_level_gamma: float, high_level_lam: float,
    bootstrap: Tensor | None, return_mode: str, dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(adv, ret) of :func:`turn_gae`: the turn-level advantage and return broadcast to the tokens of each turn."""
    if tv.K == 0:
        zeros = torch.zeros(tv.model.shape, dtype=dtype, device=tv.model.device)
        return zeros, zeros.clone()
    adv_h, v_end, r = _turn_level(
        token_rewards, values, tv, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
        bootstrap=bootstrap,
    )
    ret_h = adv_h + v_end if return_mode == "adv_plus_value" else discounted_suffix_sum(r, high_level_gamma)
    return tv.broadcast(adv_h.to(dtype)), tv.broadcast(ret_h.to(dtype))


def turn_gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    *,
    high_level_gamma: float = 0.95,
    high_level_lam: float = 1.0,
    bootstrap: Tensor | None = None,
    return_mode: str = "adv_plus_value",
) -> tuple[Tensor, Tensor]:
    """Turn-level GAE: each turn is one step; every model token of turn k gets A^H_k, return A^H_k + V(e_k)."""
    _check_return_mode(return_mode)
    if fused.usable(token_rewards, values, response_mask, turn_ids):
        return fused.gae_family(
            "turn_gae", token_rewards, values, response_mask, turn_ids, bootstrap,
            dtype=_out_dtype(token_rewards, values), high_level_gamma=high_level_gamma,
            high_level_lam=high_level_lam, return_mode=return_mode,
        )
    return _turn_outputs(
        token_rewards, values, turn_view(turn_ids, response_mask), high_level_gamma=high_level_gamma,
        high_level_lam=high_level_lam, bootstrap=bootstrap, return_mode=return_mode,
        dtype=_out_dtype(token_rewards, values),
    )


def bilevel_gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
    high_level_lam: float = 1.0,
    bootstrap: Tensor | None = None,
    return_mode: str = "adv_plus_value",
) -> tuple[Tensor, Tensor]:
    """Bi-level GAE: turn-level GAE gives the turn target G_k = A^H_k + V(e_k); token GAE inside each turn.

    Low level, backwards from e_k: delta(e_k) = G_k - V(e_k); before it delta_t = gamma * V(next model token
    of the same turn) - V_t; A_t = delta_t + gamma * lam * A_{t+1} within the turn; return A_t + V_t (or the
    turn-level reward-to-go). With gamma = lam = 1, A_t = G_k - V_t: one gather of G_k, no scan.
    """
    _check_return_mode(return_mode)
    dtype = _out_dtype(token_rewards, values)
    if fused.usable(token_rewards, values, response_mask, turn_ids):
        return fused.gae_family(
            "bilevel_gae", token_rewards, values, response_mask, turn_ids, bootstrap, dtype=dtype, gamma=gamma,
            lam=lam, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
            return_mode=return_mode,
        )
    tv = turn_view(turn_ids, response_mask)
    r, v = token_rewards.to(dtype), values.to(dtype)
    if tv.K == 0:
        return torch.zeros_like(v), torch.zeros_like(v)
    adv_h, v_end, r_turn = _turn_level(
        r, v, tv, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam, bootstrap=bootstrap,
    )
    if gamma == 1.0 and lam == 1.0:
        target = tv.broadcast((adv_h + v_end).to(dtype))  # G_k on the tokens of turn k, 0 elsewhere
        adv = tv.mask_(torch.sub(target, v))
        ret = target
    else:
        # turns are contiguous: the next model token of the turn is j + 1; at e_k, delta = G_k - V(e_k) = A^H_k
        u = _next_step_values(v, gamma)  # the token deltas, then the advantages
        _put(u, tv.last_pos, adv_h, tv.exists)
        x = chunked_scan(u, gamma * lam, cut_pos=tv.ends_or_neg())  # each turn's last token cuts the scan
        adv, ret = _outputs(x, v, tv, out=u)
    if return_mode == "reward_to_go":
        ret = tv.broadcast(discounted_suffix_sum(r_turn, high_level_gamma).to(dtype))
    return adv, ret


def weighted_gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    turn_ids: Tensor,
    *,
    turn_level_weight: float = 0.5,
    gamma: float = 1.0,
    lam: float = 1.0,
    high_level_gamma: float = 0.95,
    high_level_lam: float = 1.0,
    skip_env_tokens: bool = True,
    bootstrap: Tensor | None = None,
    return_mode: str = "adv_plus_value",
) -> tuple[Tensor, Tensor]:
    """A_t = (1 - w) * A^token_t + w * A^H_{turn(t)} with w = ``turn_level_weight`` in [0, 1].

    The return mixes the two parts' returns the same way, so w = 0 is exactly :func:`gae` and w = 1 exactly
    :func:`turn_gae` for both outputs. Both parts share one turn view (turns split the runs of model tokens).
    """
    if not 0.0 <= turn_level_weight <= 1.0:
        raise ValueError(f"turn_level_weight={turn_level_weight} must be in [0, 1] (0 = token GAE, 1 = turn GAE)")
    _check_return_mode(return_mode)
    dtype = _out_dtype(token_rewards, values)
    if fused.usable(token_rewards, values, response_mask, turn_ids):
        return fused.gae_family(
            "weighted_gae", token_rewards, values, response_mask, turn_ids, bootstrap, dtype=dtype, gamma=gamma,
            lam=lam, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
            turn_level_weight=turn_level_weight, skip_env_tokens=skip_env_tokens,
            return_mode=return_mode,
        )
    tv = turn_view(turn_ids, response_mask)
    r, v = token_rewards.to(dtype), values.to(dtype)
    adv_tok, ret_tok = _token_gae(
        r, v, tv, _boot(bootstrap, r.shape[0], r.device), gamma=gamma, lam=lam, skip_env_tokens=skip_env_tokens,
        return_mode=return_mode,
    )
    if tv.K == 0:
        return adv_tok, ret_tok
    adv_h, v_end, r_turn = _turn_level(
        r, v, tv, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam, bootstrap=bootstrap,
    )
    ret_h = adv_h + v_end if return_mode == "adv_plus_value" else discounted_suffix_sum(r_turn, high_level_gamma)
    w = turn_level_weight  # the token part is 0 off the mask and so is the turn broadcast: the mix is too
    adv = tv.broadcast_add_(adv_tok.mul_(1.0 - w), adv_h, alpha=w)
    return adv, tv.broadcast_add_(ret_tok.mul_(1.0 - w), ret_h, alpha=w)
