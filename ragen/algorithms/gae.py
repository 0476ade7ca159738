"""GAE family: token GAE over model tokens, turn-level GAE, bi-level GAE and their weighted mix.

GAE: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
eq. 16: A_t = sum_l (gamma * lam)^l delta_{t+l}, delta_t = r_t + gamma * V_{t+1} - V_t.
Turn-level and bi-level (high level over turns, low level over tokens inside a turn) follow the
hierarchical scheme of ArCHer (Zhou et al. 2024) as written out in DESIGN.md.

All tensors are (B, T) unless noted; ``response_mask`` is 1 on model tokens; ``turn_ids`` is k on the model
tokens of turn k, -1 elsewhere; ``bootstrap`` (B,) is the value to bootstrap from after a row's last step
(V at the last non-pad token for truncated rows, 0 otherwise). Outputs are (adv, ret), 0 off model tokens.
``return_mode`` is "adv_plus_value" (ret = A + V) or "reward_to_go" (ret = discounted sum of future rewards,
token level for :func:`gae`, turn level with ``high_level_gamma`` for the turn methods; no bootstrap).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algorithms.scan import TurnView, reverse_linear_scan, run_ids, shift_left, suffix_scan, turn_view

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


def _set_at(x: Tensor, pos: Tensor, new: Tensor, where: Tensor) -> Tensor:
    """Copy of x (B, T) with x[b, pos[b, k]] = new[b, k] where ``where[b, k]`` (deterministic, no index clash)."""
    return x.scatter_add(1, pos, (new - x.gather(1, pos)) * where)


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
) -> tuple[Tensor, Tensor]:
    """Token-level GAE.

    With ``skip_env_tokens`` the steps are the model tokens p_1 < ... < p_n only: the next value of p_i is
    V(p_{i+1}), env/pad tokens are neither steps nor bootstraps. Otherwise every position from p_1 to p_n is a
    step (env tokens carry reward 0). The step after the last one has value ``bootstrap`` (B,).
    Off-mask entries of rewards and values must be finite (they are multiplied by 0, never used).
    """
    _check_return_mode(return_mode)
    out_dtype = _out_dtype(token_rewards, values)
    B, T = response_mask.shape
    model = response_mask > 0
    mf = model.to(_F64)
    r, v = token_rewards.to(_F64) * mf, values.to(_F64)
    boot = _boot(bootstrap, B, v.device)
    next_v = shift_left(v)
    if skip_env_tokens:
        runs = turn_view(run_ids(response_mask), response_mask)  # maximal runs of consecutive model tokens
        # after a run's last token comes the next run's first token, or the bootstrap after the last run
        nxt = runs.set_last_turn(shift_left(v.gather(1, runs.first_pos)) * shift_left(runs.exists.to(_F64)), boot)
        next_v = _set_at(next_v, runs.last_pos, nxt, runs.exists)
        steps, stepf = model, mf
    else:
        cm = mf.cumsum(dim=1)
        total = cm[:, -1:]
        stepf = ((cm > 0) & (cm - mf < total)).to(_F64)  # from the first model token to the last one
        last = (((cm - mf) < total).sum(dim=1, keepdim=True) - 1).clamp(min=0)  # last model token
        next_v = _set_at(next_v, last, boot[:, None], (total > 0).to(_F64))
        steps = None
    delta = (r + gamma * next_v - v) * stepf
    adv = suffix_scan(delta, steps, gamma * lam)
    ret = adv + v if return_mode == "adv_plus_value" else suffix_scan(r, steps, gamma)
    return (adv * mf).to(out_dtype), (ret * mf).to(out_dtype)


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
    v_end = tv.at_turn_end(values.to(_F64))
    next_v = tv.set_last_turn(shift_left(v_end), _boot(bootstrap, v_end.shape[0], v_end.device))
    delta = (r + high_level_gamma * next_v - v_end) * tv.exists
    adv_h = reverse_linear_scan(delta, high_level_gamma * high_level_lam)
    return adv_h, v_end, r


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
    out_dtype = _out_dtype(token_rewards, values)
    tv = turn_view(turn_ids, response_mask)
    adv_h, v_end, r = _turn_level(
        token_rewards, values, tv, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
        bootstrap=bootstrap,
    )
    ret_h = adv_h + v_end if return_mode == "adv_plus_value" else reverse_linear_scan(r, high_level_gamma)
    return tv.broadcast(adv_h).to(out_dtype), tv.broadcast(ret_h).to(out_dtype)


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
    turn-level reward-to-go). With gamma = lam = 1, A_t = G_k - V_t.
    """
    _check_return_mode(return_mode)
    out_dtype = _out_dtype(token_rewards, values)
    tv = turn_view(turn_ids, response_mask)
    mf = tv.model.to(_F64)
    v = values.to(_F64)
    adv_h, v_end, r = _turn_level(
        token_rewards, v, tv, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
        bootstrap=bootstrap,
    )
    delta = (gamma * shift_left(v) - v) * mf  # turns are contiguous: the next model token of the turn is j + 1
    delta = _set_at(delta, tv.last_pos, adv_h, tv.exists)  # G_k - V(e_k) = A^H_k at the turn's last token
    adv = suffix_scan(delta, tv.model, gamma * lam, tv.segments) * mf
    if return_mode == "adv_plus_value":
        ret = (adv + v) * mf
    else:
        ret = tv.broadcast(reverse_linear_scan(r, high_level_gamma))
    return adv.to(out_dtype), ret.to(out_dtype)


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
    :func:`turn_gae` for both outputs.
    """
    if not 0.0 <= turn_level_weight <= 1.0:
        raise ValueError(f"turn_level_weight={turn_level_weight} must be in [0, 1] (0 = token GAE, 1 = turn GAE)")
    adv_tok, ret_tok = gae(
        token_rewards, values, response_mask, gamma=gamma, lam=lam, skip_env_tokens=skip_env_tokens,
        bootstrap=bootstrap, return_mode=return_mode,
    )
    adv_turn, ret_turn = turn_gae(
        token_rewards, values, response_mask, turn_ids, high_level_gamma=high_level_gamma,
        high_level_lam=high_level_lam, bootstrap=bootstrap, return_mode=return_mode,
    )
    w = turn_level_weight
    return (1 - w) * adv_tok + w * adv_turn, (1 - w) * ret_tok + w * ret_turn
