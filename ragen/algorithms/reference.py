"""SLOW reference implementations: plain per-token Python loops, for tests and the benchmark only.

Never use these in training (a 64 x 16k batch takes seconds). Each function mirrors one registered estimator
of :func:`ragen.algorithms.compute_advantage`, takes the same :class:`AdvantageInputs` and scalars, and returns
(adv, ret) as nested Python lists of shape (B, T). They share no code with the vectorised implementations, so
agreement between the two is a real check. Tensors are turned into lists first so the loops run over floats.
"""

from __future__ import annotations

import math

from ragen.algorithms.inputs import AdvantageInputs


class _Rows:
    """The inputs as Python lists, plus per-row model positions and turns."""

    def __init__(self, inp: AdvantageInputs, rows: list[int] | None = None):
        B, T = inp.token_rewards.shape
        self.rows = list(range(B)) if rows is None else rows
        sel = self.rows
        self.T = T
        self.r = inp.token_rewards[sel].tolist()
        pen = inp.token_penalties[sel].tolist() if inp.token_penalties is not None else None
        self.p = pen if pen is not None else [[0.0] * T for _ in sel]  # per-token penalties (0 without)
        self.m = inp.response_mask[sel].tolist()
        self.tid = inp.turn_ids[sel].tolist()
        self.v = inp.values[sel].tolist() if inp.values is not None else None
        self.trunc = inp.truncated[sel].tolist() if inp.truncated is not None else [False] * len(sel)
        self.boot = inp.bootstrap_values[sel].tolist() if inp.bootstrap_values is not None else None
        self.group = inp.group_ids[sel].tolist() if inp.group_ids is not None else None
        self.failed = inp.failed[sel].tolist() if inp.failed is not None else [False] * len(sel)

    def model(self, i: int) -> list[int]:
        return [t for t in range(self.T) if self.m[i][t]]

    def turns(self, i: int) -> list[list[int]]:
        """Positions of each turn's model tokens, turns in id order."""
        by_turn: dict[int, list[int]] = {}
        for t in range(self.T):
            if self.m[i][t]:
                by_turn.setdefault(self.tid[i][t], []).append(t)
        return [by_turn[k] for k in sorted(by_turn)]

    def bootstrap(self, i: int) -> float:
        """V after the row's last step: the given bootstrap value on truncated rows, 0 on rows that ended."""
        return self.boot[i] if self.trunc[i] and self.boot is not None else 0.0

    def reward(self, i: int, t: int) -> float:
        """Reward plus penalty of a model token (0 elsewhere)."""
        return self.r[i][t] + self.p[i][t] if self.m[i][t] else 0.0

    def zeros(self) -> list[list[float]]:
        return [[0.0] * self.T for _ in self.rows]


def gae_ref(inp, *, gamma=1.0, lam=1.0, skip_env_tokens=True, return_mode="adv_plus_value", rows=None):
    """The plain loop that defines ``ragen.algorithms.gae.gae`` on every row of ``inp``
    (its docstring shows the loop for one row)."""
    d = _Rows(inp, rows)
    adv, ret = d.zeros(), d.zeros()
    for i in range(len(d.rows)):
        model = d.model(i)
        if not model:
            continue
        steps = model if skip_env_tokens else list(range(model[0], model[-1] + 1))
        next_v, a, g = d.bootstrap(i), 0.0, 0.0
        for t in reversed(steps):
            r = d.reward(i, t)
            a = r + gamma * next_v - d.v[i][t] + gamma * lam * a
            g = r + gamma * g
            if d.m[i][t]:
                adv[i][t] = a
                ret[i][t] = a + d.v[i][t] if return_mode == "adv_plus_value" else g
            next_v = d.v[i][t]
    return adv, ret


def _turn_level_ref(d: _Rows, i: int, gamma_h: float, lam_h: float, *, with_penalties: bool):
    """(turns, A^H_k, V(s_k), reward-to-go_k) lists for row i; V(s_k) is the value at turn k's first token."""
    turns = d.turns(i)
    n = len(turns)
    r = [sum(d.reward(i, t) if with_penalties else d.r[i][t] for t in turn) for turn in turns]
    v_start = [d.v[i][turn[0]] for turn in turns]
    adv_h, rtg = [0.0] * n, [0.0] * n
    a, g = 0.0, 0.0
    for k in reversed(range(n)):
        next_v = v_start[k + 1] if k + 1 < n else d.bootstrap(i)
        a = r[k] + gamma_h * next_v - v_start[k] + gamma_h * lam_h * a
        g = r[k] + gamma_h * g
        adv_h[k], rtg[k] = a, g
    return turns, adv_h, v_start, rtg


def turn_gae_ref(inp, *, high_level_gamma=0.95, high_level_lam=1.0, return_mode="adv_plus_value", rows=None):
    """The plain loop that defines ``ragen.algorithms.gae.turn_gae`` on every row of ``inp``
    (its docstring shows the loop for one row)."""
    d = _Rows(inp, rows)
    adv, ret = d.zeros(), d.zeros()
    for i in range(len(d.rows)):
        turns, adv_h, v_start, rtg = _turn_level_ref(d, i, high_level_gamma, high_level_lam, with_penalties=True)
        for k, turn in enumerate(turns):
            for t in turn:
                adv[i][t] = adv_h[k]
                ret[i][t] = adv_h[k] + v_start[k] if return_mode == "adv_plus_value" else rtg[k]
    return adv, ret


def bilevel_gae_ref(inp, *, gamma=1.0, lam=1.0, high_level_gamma=0.95, high_level_lam=1.0,
                    return_mode="adv_plus_value", rows=None):
    """The plain loop that defines ``ragen.algorithms.gae.bilevel_gae`` on every row of ``inp``
    (its docstring shows the loop for one row)."""
    d = _Rows(inp, rows)
    adv, ret = d.zeros(), d.zeros()
    for i in range(len(d.rows)):
        turns, adv_h, v_start, rtg = _turn_level_ref(d, i, high_level_gamma, high_level_lam, with_penalties=False)
        for k, turn in enumerate(turns):
            target = adv_h[k] + v_start[k]
            a = 0.0
            for j in reversed(range(len(turn))):
                t = turn[j]
                if j == len(turn) - 1:
                    a = d.p[i][t] + target - d.v[i][t]
                else:
                    a = d.p[i][t] + gamma * d.v[i][turn[j + 1]] - d.v[i][t] + gamma * lam * a
                adv[i][t] = a
                ret[i][t] = a + d.v[i][t] if return_mode == "adv_plus_value" else rtg[k]
    return adv, ret


def weighted_gae_ref(inp, *, turn_level_weight=0.5, gamma=1.0, lam=1.0, high_level_gamma=0.95, high_level_lam=1.0,
                     skip_env_tokens=True, return_mode="adv_plus_value", rows=None):
    """``ragen.algorithms.gae.weighted_gae``: the mix of :func:`gae_ref` and :func:`turn_gae_ref`."""
    a1, r1 = gae_ref(inp, gamma=gamma, lam=lam, skip_env_tokens=skip_env_tokens, return_mode=return_mode, rows=rows)
    a2, r2 = turn_gae_ref(inp, high_level_gamma=high_level_gamma, high_level_lam=high_level_lam,
                          return_mode=return_mode, rows=rows)
    w = turn_level_weight
    mix = [[(1 - w) * x + w * y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a1, a2, strict=True)]
    mix_ret = [[(1 - w) * x + w * y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(r1, r2, strict=True)]
    return mix, mix_ret


# ---- group-relative ----------------------------------------------------------------------------------------


def normalize_ref(xs: list[float], *, eps: float, norm_by_std: bool = True) -> list[float]:
    """Ahat over one group: (x - mean) / (unbiased std + eps); constant groups (and singletons) give 0."""
    n = len(xs)
    if n == 0 or max(xs) == min(xs):
        return [0.0] * n
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / max(n - 1, 1))
    return [(x - mean) / (std + eps) if norm_by_std else x - mean for x in xs]


def _group_scores(keys: list, xs: list[float], *, eps: float, norm_by_std: bool) -> list[float]:
    members: dict = {}
    for idx, key in enumerate(keys):
        members.setdefault(key, []).append(idx)
    out = [0.0] * len(xs)
    for idxs in members.values():
        for idx, val in zip(idxs, normalize_ref([xs[j] for j in idxs], eps=eps, norm_by_std=norm_by_std), strict=True):
            out[idx] = val
    return out


def _fill_rows(d: _Rows, per_row: list[float]):
    adv = d.zeros()
    for i in range(len(d.rows)):
        for t in d.model(i):
            adv[i][t] = per_row[i]
    return adv, [row[:] for row in adv]


def _totals(d: _Rows) -> list[float]:
    return [sum(d.reward(i, t) for t in d.model(i)) for i in range(len(d.rows))]


def _valid_keys(d: _Rows, keys: list) -> list:
    """Group keys with failed rows moved to groups of their own (None: scored 0, counted nowhere)."""
    return [None if d.failed[i] else k for i, k in enumerate(keys)]


def _group_scores_valid(d: _Rows, keys: list, xs: list[float], *, eps: float, norm_by_std: bool) -> list[float]:
    keys = _valid_keys(d, keys)
    scores = _group_scores([("failed", i) if k is None else k for i, k in enumerate(keys)], xs, eps=eps,
                           norm_by_std=norm_by_std)
    return [0.0 if k is None else s for k, s in zip(keys, scores, strict=True)]


def grpo_ref(inp, *, eps=1e-6, norm_by_std=True):
    d = _Rows(inp)
    return _fill_rows(d, _group_scores_valid(d, d.group, _totals(d), eps=eps, norm_by_std=norm_by_std))


def rloo_ref(inp):
    d = _Rows(inp)
    totals = _totals(d)
    scores = []
    for i in range(len(d.rows)):
        others = [totals[j] for j in range(len(d.rows))
                  if j != i and d.group[j] == d.group[i] and not d.failed[j]]
        scores.append(totals[i] - sum(others) / len(others) if others and not d.failed[i] else 0.0)
    return _fill_rows(d, scores)


def reinforce_pp_ref(inp, *, gamma=1.0, eps=1e-6):
    d = _Rows(inp)
    ret = d.zeros()
    flat = []
    for i in range(len(d.rows)):
        g = 0.0
        for t in reversed(d.model(i)):
            g = d.reward(i, t) + gamma * g
            ret[i][t] = g
        flat += [ret[i][t] for t in d.model(i)]
    mean = sum(flat) / max(len(flat), 1)
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / max(len(flat), 1))  # population std
    adv = d.zeros()
    for i in range(len(d.rows)):
        for t in d.model(i):
            adv[i][t] = (ret[i][t] - mean) / (std + eps)
    return adv, ret


def _turn_fill(d: _Rows, per_turn: list[list[float]]):
    adv = d.zeros()
    for i in range(len(d.rows)):
        for k, turn in enumerate(d.turns(i)):
            for t in turn:
                adv[i][t] = per_turn[i][k]
    return adv, [row[:] for row in adv]


def _column_scores(d: _Rows, x: list[list[float]], *, eps, norm_by_std):
    """Ahat_k of x[i][k] over all the group's valid rows, a row without a turn k counting 0 (None: failed rows)."""
    n_cols = max((len(d.turns(i)) for i in range(len(d.rows))), default=0)
    out = [[0.0] * n_cols for _ in d.rows]
    for k in range(n_cols):
        col = [x[i][k] if k < len(d.turns(i)) else 0.0 for i in range(len(d.rows))]
        scores = _group_scores_valid(d, d.group, col, eps=eps, norm_by_std=norm_by_std)
        for i in range(len(d.rows)):
            out[i][k] = scores[i]
    return out


def _tool_flags(inp, d: _Rows) -> list[list[bool]]:
    """Per row, per existing turn: did the turn receive a tool result."""
    flags = inp.tool_results.tolist()
    return [[bool(flags[i][k]) for k in range(len(d.turns(i)))] for i in range(len(d.rows))]


def ms_grpo_ref(inp, *, step_advantage_coef=1.0, eps=1e-6, norm_by_std=True):
    d = _Rows(inp)
    rt, ro = inp.step_rewards.tolist(), inp.outcome_rewards.tolist()
    got = _tool_flags(inp, d)
    a_out = _group_scores_valid(d, d.group, ro, eps=eps, norm_by_std=norm_by_std)
    a_step = _column_scores(d, rt, eps=eps, norm_by_std=norm_by_std)
    per_turn = []
    for i in range(len(d.rows)):
        row = []
        for k in range(len(d.turns(i))):
            row.append(a_out[i] + step_advantage_coef * a_step[i][k] if got[i][k] else a_out[i])
        per_turn.append(row)
    return _turn_fill(d, per_turn)


def ms_po_ref(inp, *, discount_factor=1.0, eps=1e-6, norm_by_std=True):
    d = _Rows(inp)
    rt, ro = inp.step_rewards.tolist(), inp.outcome_rewards.tolist()
    got = _tool_flags(inp, d)
    totals = [sum(rt[i][k] for k in range(len(d.turns(i)))) + discount_factor * ro[i] for i in range(len(d.rows))]
    a_total = _group_scores_valid(d, d.group, totals, eps=eps, norm_by_std=norm_by_std)
    a_out = _group_scores_valid(d, d.group, ro, eps=eps, norm_by_std=norm_by_std)
    per_turn = []
    for i in range(len(d.rows)):
        row, seen = [], False
        for k in range(len(d.turns(i))):
            row.append(a_out[i] if seen else a_total[i])  # the turn that gets the first result is still before it
            seen = seen or got[i][k]
        per_turn.append(row)
    return _turn_fill(d, per_turn)


def gigpo_ref(inp, *, gamma=1.0, step_advantage_weight=1.0, eps=1e-6, norm_by_std=True):
    d = _Rows(inp)
    a_ep = _group_scores_valid(d, d.group, _totals(d), eps=eps, norm_by_std=norm_by_std)
    keys, vals, where = [], [], []
    for i in range(len(d.rows)):
        turns = d.turns(i)
        g = 0.0
        disc = [0.0] * len(turns)
        for k in reversed(range(len(turns))):
            g = sum(d.reward(i, t) for t in turns[k]) + gamma * g
            disc[k] = g
        for k in range(len(turns)):
            keys.append((d.group[i], inp.turn_obs_keys[i][k]))
            vals.append(disc[k])
            where.append((i, k))
    flat_rows = [i for i, _ in where]
    keys = [("failed", j) if d.failed[i] else key for j, (i, key) in enumerate(zip(flat_rows, keys, strict=True))]
    scores = _group_scores(keys, vals, eps=eps, norm_by_std=norm_by_std)
    scores = [0.0 if d.failed[i] else s for i, s in zip(flat_rows, scores, strict=True)]
    per_turn = [[a_ep[i]] * len(d.turns(i)) for i in range(len(d.rows))]
    for (i, k), s in zip(where, scores, strict=True):
        per_turn[i][k] += step_advantage_weight * s
    return _turn_fill(d, per_turn)


REFERENCES = {
    "gae": gae_ref, "turn_gae": turn_gae_ref, "bilevel_gae": bilevel_gae_ref, "weighted_gae": weighted_gae_ref,
    "grpo": grpo_ref, "rloo": rloo_ref, "reinforce_pp": reinforce_pp_ref, "ms_grpo": ms_grpo_ref,
    "ms_po": ms_po_ref, "gigpo": gigpo_ref,
}


# ---- synthetic batches (tests and bench) ---------------------------------------------------------------------


def random_inputs(
    B: int,
    *,
    seed: int = 0,
    max_turns: int = 4,
    min_turns: int = 1,
    model_len: tuple[int, int] = (1, 6),
    env_len: tuple[int, int] = (0, 4),
    prompt_len: tuple[int, int] = (1, 4),
    group_size: int = 3,
    left_pad_frac: float = 0.3,
    truncated_frac: float = 0.3,
    zero_reward_frac: float = 0.3,
    dense_reward_frac: float = 0.0,
    penalties: bool = False,
    failed_frac: float = 0.0,
    no_tool_frac: float = 0.3,
    dtype=None,
    T: int | None = None,
) -> AdvantageInputs:
    """Random batch in the rollout layout: prompt, then min_turns..max_turns turns separated by env gaps, then padding.

    Turn ends carry rewards (some exactly 0); with ``dense_reward_frac`` other model tokens get small rewards
    too. ``penalties`` adds random per-token ``token_penalties`` (like a KL penalty; garbage off model tokens);
    ``failed_frac`` of the rows are marked ``failed``. ``tool_results`` flags about half the turns of a row, except
    in ``no_tool_frac`` of the rows, which receive no tool result; step rewards are random on flagged and unflagged
    turns alike. Env/pad positions get random values *and* random rewards,
    which every estimator must ignore. Some rows are left-padded, some truncated (those end with an env
    observation; every row gets a random ``bootstrap_values`` entry, read only where truncated). Lengths are
    capped at ``T`` (default: the longest row) by dropping turns that do not fit.
    """
    import random

    import torch

    rng = random.Random(seed)
    rows = []
    for _ in range(B):
        n_turns = rng.randint(min_turns, max_turns)
        trunc = rng.random() < truncated_frac
        seq = [(-2, 0.0)] * rng.randint(*prompt_len)  # (turn id, reward); -2 = prompt/env token
        for k in range(n_turns):
            n = rng.randint(*model_len)
            if T is not None and len(seq) + n > T:
                break
            for j in range(n):
                last = j == n - 1
                rew = (0.0 if rng.random() < zero_reward_frac else rng.uniform(-1, 1)) if last else (
                    rng.uniform(-0.1, 0.1) if rng.random() < dense_reward_frac else 0.0)
                seq.append((k, rew))
            gap = rng.randint(*env_len) if (k < n_turns - 1 or trunc) else 0
            if T is not None:
                gap = min(gap, T - len(seq))
            seq += [(-2, 0.0)] * gap
        rows.append((seq, trunc, rng.random() < left_pad_frac))
    T = T if T is not None else max(len(s) for s, _, _ in rows)
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)  # garbage off model tokens
    turn_ids = torch.full((B, T), -1, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    for b, (seq, _, left) in enumerate(rows):
        off = T - len(seq) if left else 0
        attn[b, off:off + len(seq)] = 1
        tids = torch.tensor([k for k, _ in seq], dtype=torch.long)
        turn_ids[b, off:off + len(seq)] = tids.clamp(min=-1)
        model = tids >= 0
        rew_row = torch.tensor([r for _, r in seq], dtype=torch.float64)
        seg = rewards[b, off:off + len(seq)]
        seg[model] = rew_row[model]
    response_mask = (turn_ids >= 0).long()
    K = int(turn_ids.max()) + 1
    num_turns = (turn_ids.max(dim=1).values + 1).tolist()
    step = torch.rand(B, K, generator=g, dtype=torch.float64)
    step[torch.arange(K)[None, :] >= torch.tensor(num_turns)[:, None]] = 0.0
    dt = dtype or torch.float64
    tool_rng = random.Random(f"tool_results {seed}")  # its own stream: the other fields do not depend on it
    tools = torch.zeros(B, K, dtype=torch.bool)
    for b in range(B):
        n = max(num_turns[b], 0)
        if tool_rng.random() >= no_tool_frac:
            tools[b, :n] = torch.tensor([tool_rng.random() < 0.5 for _ in range(n)], dtype=torch.bool)
    return AdvantageInputs(
        token_rewards=rewards.to(dt),
        response_mask=response_mask,
        turn_ids=turn_ids,
        values=values.to(dt),
        group_ids=torch.tensor([b // group_size for b in range(B)], dtype=torch.long)[torch.randperm(B, generator=g)],
        truncated=torch.tensor([t for _, t, _ in rows]),
        step_rewards=step.to(dt),
        outcome_rewards=torch.randint(0, 3, (B,), generator=g).to(dt) / 2,
        tool_results=tools,
        turn_obs_keys=[[f"s{rng.randint(0, 2)}" for _ in range(max(num_turns[b], 0))] for b in range(B)],
        attention_mask=attn,
        bootstrap_values=torch.randn(B, generator=g, dtype=torch.float64).to(dt),
        token_penalties=(0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).to(dt) if penalties else None,
        failed=torch.rand(B, generator=g) < failed_frac,
    )
