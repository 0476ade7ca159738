"""GAE family: token GAE over model tokens, turn-level GAE, bi-level GAE and their weighted mix.

GAE: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
eq. 16: A_t = sum_l (gamma * lam)^l delta_{t+l}, delta_t = r_t + gamma * V_{t+1} - V_t. Turn-level and bi-level
(a high level over turns, a low level over the tokens inside a turn) follow the hierarchical scheme of ArCHer
(Zhou et al. 2024), as written out with a worked example in docs/estimators.md.

Position conventions (every tensor is (B, T) unless noted):
- ``values[:, t]`` is V of the context *before* token t: the critic's head on the hidden state at t - 1, the
  position the policy's log-prob of token t comes from (``values[:, 0] = 0``). So V_t is a state value, not a
  Q value: it has not read token t. See :class:`ragen.models.value_head.ValueModel`.
- ``response_mask`` is 1 on model tokens; ``turn_ids`` is k on the model tokens of turn k, -1 elsewhere. Turn
  k's first model token is s_k (V(s_k) = the state after observation k, before response k), its last e_k.
- ``token_rewards``: the env reward of turn k sits on e_k. ``token_penalties`` (optional): per-token terms on
  model tokens (a KL penalty), applied at their own tokens by the token-level recursions.
- ``bootstrap`` (B,): the value after a row's last step: V of the state after the last real token for rows
  cut by a length budget (``truncated``), 0 for rows that ended (the env, or max_turn, which the prompt states).
Outputs (adv, ret) are exactly 0 off model tokens, in the promoted dtype of rewards and values (at least float32);
internally everything runs in float64 on rows compacted to their model tokens (:class:`TurnView`).
``return_mode`` is "adv_plus_value" (ret = A + V) or "reward_to_go" (ret = the discounted sum of future rewards:
token level for :func:`gae`, turn level with ``high_level_gamma`` for the turn methods; no bootstrap).

The docstrings of :func:`gae`, :func:`turn_gae` and :func:`bilevel_gae` state the recursion each computes as a plain
loop over one row (lists of length T, read from the tensors' row b), and name the reference of
``ragen.algorithms.reference`` that runs the same loop on whole batches; tests/algorithms/test_estimators_reference.py
compares each function with its reference, tests/algorithms/test_gae_docstring_loops.py with the loop shown.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ragen.algorithms.scan import TurnView, compact, discounted_suffix_sum, powers, scatter_back, turn_view

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


def _gathered_rewards(token_rewards: Tensor, token_penalties: Tensor | None, tv: TurnView) -> Tensor:
    """(B, N) float64: rewards plus penalties of each row's model tokens, in order."""
    r = tv.gather(token_rewards).to(_F64)
    return r if token_penalties is None else r + tv.gather(token_penalties).to(_F64)


def _next_values(v: Tensor, valid: Tensor, boot: Tensor) -> Tensor:
    """(B, N): the value of the next step of each compacted step, ``boot`` after a row's last one."""
    nxt = F.pad(v[:, 1:], (0, 1))
    last = (valid.sum(dim=1) - 1).clamp(min=0)[:, None]
    return nxt.scatter(1, last, boot[:, None])


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
    token_penalties: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE.

    With ``skip_env_tokens`` the steps are the model tokens p_1 < ... < p_n only: the next value of p_i is
    V(p_{i+1}), env / pad tokens are neither steps nor bootstraps. Otherwise every position from p_1 to p_n is a
    step (env tokens carry reward 0 and their values are read). The step after the last one has value
    ``bootstrap`` (B,). The reward of a step is ``token_rewards`` (+ ``token_penalties``) on model tokens.

    One row b as a plain loop (``rewards, penalties, values, mask`` = row b of ``token_rewards``,
    ``token_penalties`` (zeros without), ``values``, ``response_mask``; ``boot`` = ``bootstrap[b]``, 0 without;
    the reference ``ragen.algorithms.reference.gae_ref`` runs the same loop)::

        adv, ret = [0.0] * T, [0.0] * T
        model = [t for t in range(T) if mask[t]]
        steps = model if skip_env_tokens or not model else list(range(model[0], model[-1] + 1))
        next_v, A, rtg = boot, 0.0, 0.0
        for t in reversed(steps):
            r = rewards[t] + penalties[t] if mask[t] else 0.0
            A = r + gamma * next_v - values[t] + gamma * lam * A  # A_t = delta_t + gamma * lam * A_{t+1}
            rtg = r + gamma * rtg
            if mask[t]:
                adv[t], ret[t] = A, (A + values[t] if return_mode == "adv_plus_value" else rtg)
            next_v = values[t]
    """
    _check_return_mode(return_mode)
    dtype = _out_dtype(token_rewards, values)
    model = response_mask if response_mask.dtype == torch.bool else response_mask > 0
    B, T = model.shape
    steps = model
    if not skip_env_tokens:  # every position between a row's first and last model token
        steps = (model.cumsum(dim=1) > 0) & (model.flip(1).cumsum(dim=1).flip(1) > 0)
    pos, valid = compact(steps)
    if pos.shape[1] == 0:  # no model tokens in the batch: nothing to estimate
        zeros = torch.zeros(B, T, dtype=dtype, device=model.device)
        return zeros, zeros.clone()
    on_model = model.gather(1, pos) & valid
    r = torch.where(on_model, token_rewards.gather(1, pos).to(_F64), 0.0)
    if token_penalties is not None:
        r = r + torch.where(on_model, token_penalties.gather(1, pos).to(_F64), 0.0)
    v = torch.where(valid, values.gather(1, pos).to(_F64), 0.0)
    delta = (r + gamma * _next_values(v, valid, _boot(bootstrap, B, values.device)) - v) * valid
    adv = discounted_suffix_sum(delta, gamma * lam)
    ret = adv + v if return_mode == "adv_plus_value" else discounted_suffix_sum(r, gamma)
    return scatter_back(adv.to(dtype), pos, on_model, T), scatter_back(ret.to(dtype), pos, on_model, T)


def turn_level(
    turn_rewards: Tensor, tv: TurnView, values: Tensor, *, high_level_gamma: float, high_level_lam: float,
    bootstrap: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """High-level GAE over turns. Returns (A^H, V(s_k)), each (B, K) float64.

    turn_rewards: (B, K) r_k. delta_k = r_k + gamma_H * V(s_{k+1}) - V(s_k), where V(s_n) after the last turn is
    the bootstrap; A^H_k = delta_k + gamma_H * lam_H * A^H_{k+1}. V(s_k) is the value at turn k's *first* model
    token: the state before response k (the value at e_k has read response k: about Q(s_k, a_k)).
    """
    v_start = tv.at_first(values)
    if tv.K == 0:
        return torch.zeros_like(v_start), v_start
    nxt = F.pad(v_start[:, 1:], (0, 1))
    last = (tv.num_turns - 1).clamp(min=0)[:, None]
    nxt = nxt.scatter(1, last, _boot(bootstrap, v_start.shape[0], v_start.device)[:, None])
    delta = torch.where(tv.exists, turn_rewards.to(_F64) + high_level_gamma * nxt - v_start, 0.0)
    return discounted_suffix_sum(delta, high_level_gamma * high_level_lam), v_start


def _turn_returns(adv_h: Tensor, v_start: Tensor, turn_rewards: Tensor, gamma_h: float, return_mode: str) -> Tensor:
    """(B, K) turn-level return: A^H_k + V(s_k), or the discounted turn reward-to-go."""
    return adv_h + v_start if return_mode == "adv_plus_value" else discounted_suffix_sum(turn_rewards, gamma_h)


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
    token_penalties: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Turn-level GAE: each turn is one step with reward r_k = the sum of turn k's rewards and penalties; every
    model token of turn k gets A^H_k and the return A^H_k + V(s_k) (see :func:`turn_level`).

    One row b as a plain loop (lists as in :func:`gae`, plus ``turn_ids`` = row b of ``turn_ids``; the reference
    ``ragen.algorithms.reference.turn_gae_ref`` runs the same loop)::

        turns = [[t for t in range(T) if mask[t] and turn_ids[t] == k] for k in range(max(turn_ids) + 1)]
        r = [sum(rewards[t] + penalties[t] for t in turn) for turn in turns]  # r_k
        v_s = [values[turn[0]] for turn in turns]  # V(s_k): the value at turn k's first model token
        adv, ret = [0.0] * T, [0.0] * T
        next_v, A, rtg = boot, 0.0, 0.0
        for k in reversed(range(len(turns))):
            A = r[k] + high_level_gamma * next_v - v_s[k] + high_level_gamma * high_level_lam * A  # A^H_k
            rtg = r[k] + high_level_gamma * rtg
            for t in turns[k]:
                adv[t], ret[t] = A, (A + v_s[k] if return_mode == "adv_plus_value" else rtg)
            next_v = v_s[k]
    """
    _check_return_mode(return_mode)
    tv = turn_view(turn_ids, response_mask)
    r_turn = tv.sum_per_turn(_gathered_rewards(token_rewards, token_penalties, tv))
    adv_h, v_start = turn_level(r_turn, tv, values, high_level_gamma=high_level_gamma,
                                high_level_lam=high_level_lam, bootstrap=bootstrap)
    ret_h = _turn_returns(adv_h, v_start, r_turn, high_level_gamma, return_mode)
    dtype = _out_dtype(token_rewards, values)
    return tv.broadcast(adv_h.to(dtype)), tv.broadcast(ret_h.to(dtype))


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
    token_penalties: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Bi-level GAE: the high level (:func:`turn_level` on the env turn rewards r_k) gives the turn target
    G_k = A^H_k + V(s_k); token GAE runs inside each turn towards it.

    Low level, backwards from e_k: delta(e_k) = p(e_k) + G_k - V(e_k); before it delta_t = p_t + gamma *
    V(next model token of the same turn) - V_t, with p the ``token_penalties`` (0 without); A_t = delta_t +
    gamma * lam * A_{t+1} within the turn; return A_t + V_t (or the turn-level reward-to-go). With gamma = lam = 1
    and no penalties, A_t = G_k - V_t.

    One row b as a plain loop (lists as in :func:`turn_gae`; the reference
    ``ragen.algorithms.reference.bilevel_gae_ref`` runs the same loop)::

        turns = [[t for t in range(T) if mask[t] and turn_ids[t] == k] for k in range(max(turn_ids) + 1)]
        r = [sum(rewards[t] for t in turn) for turn in turns]  # env rewards only: penalties act per token
        v_s = [values[turn[0]] for turn in turns]
        adv, ret = [0.0] * T, [0.0] * T
        next_v, A_H, rtg = boot, 0.0, 0.0
        for k in reversed(range(len(turns))):
            A_H = r[k] + high_level_gamma * next_v - v_s[k] + high_level_gamma * high_level_lam * A_H
            rtg = r[k] + high_level_gamma * rtg
            next_t, A = None, 0.0  # the low level restarts at each turn's last token e_k
            for t in reversed(turns[k]):
                target = A_H + v_s[k] if next_t is None else gamma * values[next_t]  # G_k at e_k
                A = penalties[t] + target - values[t] + gamma * lam * A
                adv[t], ret[t] = A, (A + values[t] if return_mode == "adv_plus_value" else rtg)
                next_t = t
            next_v = v_s[k]
    """
    _check_return_mode(return_mode)
    tv = turn_view(turn_ids, response_mask)
    r_turn = tv.sum_per_turn(_gathered_rewards(token_rewards, None, tv))
    adv_h, v_start = turn_level(r_turn, tv, values, high_level_gamma=high_level_gamma,
                                high_level_lam=high_level_lam, bootstrap=bootstrap)
    v = tv.gather(values).to(_F64)
    p = tv.gather(token_penalties).to(_F64) if token_penalties is not None else torch.zeros_like(v)
    same_turn_next = F.pad(tv.valid[:, 1:] & (tv.tid[:, 1:] == tv.tid[:, :-1]), (0, 1), value=False)
    target = tv.per_token(adv_h + v_start)  # G_k on every token of turn k
    delta = torch.where(same_turn_next, p + gamma * F.pad(v[:, 1:], (0, 1)) - v, p + target - v) * tv.valid
    adv = _suffix_sum_within_turns(delta, same_turn_next, gamma * lam)
    if return_mode == "adv_plus_value":
        ret = adv + v
    else:
        ret = tv.per_token(_turn_returns(adv_h, v_start, r_turn, high_level_gamma, return_mode))
    dtype = _out_dtype(token_rewards, values)
    return tv.scatter(adv.to(dtype)), tv.scatter(ret.to(dtype))


def _suffix_sum_within_turns(delta: Tensor, same_turn_next: Tensor, c: float) -> Tensor:
    """(B, N) ``x_i = delta_i + c x_{i+1}`` where i + 1 is in the same turn, ``x_i = delta_i`` at a turn's end.

    The suffix sum over the whole row minus, per token, what the later turns contribute: with X the row-wide
    sum and j the first token of the next turn, x_i = X_i - c^(j - i) X_j.
    """
    X = discounted_suffix_sum(delta, c)
    B, N = X.shape
    idx = torch.arange(N, device=X.device).expand(B, N)
    # the first token of the next turn: the nearest turn end at or after i, plus one
    end_at = torch.where(same_turn_next, N, idx)
    nxt = end_at.flip(1).cummin(dim=1).values.flip(1) + 1
    later = F.pad(X, (0, 1)).gather(1, nxt.clamp(max=N))
    return X - powers(c, N + 1, X.device)[nxt - idx] * later


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
    token_penalties: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """A_t = (1 - w) * A^token_t + w * A^H_{turn(t)} with w = ``turn_level_weight`` in [0, 1].

    The return mixes the two parts' returns the same way, so w = 0 is exactly :func:`gae` and w = 1 exactly
    :func:`turn_gae` for both outputs (penalties at their tokens in the token part, summed into r_k in the turn
    part). The two parts are the loops shown in those functions; ``ragen.algorithms.reference.weighted_gae_ref``
    mixes their references.
    """
    if not 0.0 <= turn_level_weight <= 1.0:
        raise ValueError(f"turn_level_weight={turn_level_weight} must be in [0, 1] (0 = token GAE, 1 = turn GAE)")
    common = dict(bootstrap=bootstrap, return_mode=return_mode, token_penalties=token_penalties)
    adv_tok, ret_tok = gae(token_rewards, values, response_mask, gamma=gamma, lam=lam,
                           skip_env_tokens=skip_env_tokens, **common)
    adv_turn, ret_turn = turn_gae(token_rewards, values, response_mask, turn_ids, high_level_gamma=high_level_gamma,
                                  high_level_lam=high_level_lam, **common)
    w = turn_level_weight
    return (1 - w) * adv_tok + w * adv_turn, (1 - w) * ret_tok + w * ret_turn
