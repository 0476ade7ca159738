"""Fixed inputs of the liveness walk's pure probes: one hand-built batch in both layouts, with its critic values and
log-probs (imported as ``from liveness_inputs import ...``; pytest puts this folder on ``sys.path``).

Nine episodes in three groups of three (each group shares its prompt), 1 to 3 turns each: a truncated episode (its
last turn cut by a length budget: the GAE family bootstraps it), a failed one (masked, left out of group
statistics), step and outcome rewards (MS-GRPO / MS-PO / ``use_step_reward``) and observation keys shared within a
group (GiGPO's step groups), tool-result flags on some non-final turns (none in some episodes: MS-GRPO / MS-PO's
split), engine log-probs off the trainer's (rollout correction). Rewards are chosen so the groups' reward spreads
differ (rollout filtering keeps the widest). Every per-token tensor is a function of (episode, absolute position),
so the turn layout, built from the trajectory rows by :func:`to_turn_layout`, sees the very same numbers on each model
token.
"""

from __future__ import annotations

import torch

from ragen.agent.batch import RolloutBatch

PAD, EOT = 0, 1
PROMPT_LEN, OBS_LEN = 4, 2
# per episode: group, per-turn step rewards, outcome reward, truncated, failed
EPISODES = [
    (0, [0.1, -0.2, 0.3], 1.0, False, False),
    (0, [0.2, 0.0], 0.0, False, False),
    (0, [0.5], 2.0, False, False),
    (1, [0.3, 0.1], 0.0, True, False),
    (1, [-0.1, 0.4, 0.2], 0.5, False, False),
    (1, [0.0], 0.25, False, False),
    (2, [0.6, 0.2], 0.0, False, True),
    (2, [0.1, 0.3], 1.5, False, False),
    (2, [0.2, -0.3, 0.1], -0.5, False, False),
]
# Extra per-token tensors carried in ``RolloutBatch.extra`` (so ``select`` and rollout filtering keep them aligned).
TOKEN_EXTRAS = ("values", "old_log_probs", "ref_log_probs", "log_probs", "entropy")


def _row(e: int) -> tuple[list[int], list[int]]:
    """(ids, turn ids) of episode ``e``: prompt, then per turn its model tokens (1 to 3) and an observation (an
    end-of-turn token after the last turn)."""
    group, steps, _, _, failed = EPISODES[e]
    ids, tid = [10 + group] * PROMPT_LEN, [-1] * PROMPT_LEN
    for k in range(len(steps)):
        n = 1 + (e + 2 * k) % 3  # ragged: 1 to 3 model tokens per turn
        ids += [20 + 3 * e + k + j for j in range(n)]
        tid += [-1 if failed else k] * n
        tail = [30 + k] * OBS_LEN if k < len(steps) - 1 else [EOT]
        ids += tail
        tid += [-1] * len(tail)
    return ids, tid


def _token_tensor(seed: int, shape: tuple[int, int], scale: float, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale + shift


def trajectory_batch() -> RolloutBatch:
    """The nine episodes as trajectory rows (see the module docstring), right-padded."""
    rows = [_row(e) for e in range(len(EPISODES))]
    B, T = len(rows), max(len(r[0]) for r in rows)
    K = max(len(ep[1]) for ep in EPISODES)
    ids = torch.full((B, T), PAD)
    attn = torch.zeros(B, T, dtype=torch.long)
    tids = torch.full((B, T), -1)
    rewards = torch.zeros(B, T)
    turn_rewards, step_rewards = torch.zeros(B, K), torch.zeros(B, K)
    tools = torch.zeros(B, K, dtype=torch.bool)
    for b, (row, tid) in enumerate(rows):
        _, steps, outcome, _, failed = EPISODES[b]
        ids[b, :len(row)] = torch.tensor(row)
        attn[b, :len(row)] = 1
        tids[b, :len(tid)] = torch.tensor(tid)
        for k, s in enumerate(steps):
            total = s + (outcome if k == len(steps) - 1 else 0.0)
            turn_rewards[b, k], step_rewards[b, k] = total, s
            tools[b, k] = k < len(steps) - 1 and (b + k) % 2 == 0  # a tool call answered before the last turn
            pos = (tids[b] == k).nonzero()
            if len(pos) and not failed:
                rewards[b, int(pos[-1])] = total
    resp = (tids >= 0).long()
    lp_old = -_token_tensor(1, (B, T), 0.5, 1.5).abs()
    delta = torch.rand((B, T), generator=torch.Generator().manual_seed(2)) * 2.0 - 1.0  # ratios e^-1 .. e^1
    ref = lp_old - _token_tensor(3, (B, T), 0.6)
    ref[0, PROMPT_LEN] = lp_old[0, PROMPT_LEN] - 25.0  # far from the policy: low_var_kl's clamps bind here
    on = resp.float()
    # the engine's log-probs: log(pi_old / mu) ~ 0.3 noise per token, episode 0 about +1 (token ratios ~e, outside the
    # rollout-correction band [0.5, 2]), episode 4 about -0.4 (geometric mean inside the band, product outside)
    offset = torch.tensor([1.0 if b == 0 else -0.4 if b == 4 else 0.0 for b in range(B)])[:, None]
    engine = lp_old - (_token_tensor(9, (B, T), 0.3) + offset)
    extra = {
        "values": _token_tensor(4, (B, T), 0.7) * attn,
        "old_log_probs": lp_old * on,
        "ref_log_probs": ref * on,
        "log_probs": (lp_old + delta) * on,
        "entropy": _token_tensor(5, (B, T), 0.3, 1.0).abs() * on,
        "last_values": _token_tensor(6, (B, 1), 0.8).flatten(),
    }
    keys = [[f"g{ep[0]}-k{k}" + ("" if k == 0 else f"-{b % 2}") for k in range(len(ep[1]))]
            for b, ep in enumerate(EPISODES)]
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp, turn_ids=tids, token_rewards=rewards,
        sample_log_probs=engine * on, group_ids=torch.tensor([ep[0] for ep in EPISODES]),
        turn_rewards=turn_rewards, num_turns=torch.tensor([len(ep[1]) for ep in EPISODES]),
        truncated=torch.tensor([ep[3] for ep in EPISODES]), step_rewards=step_rewards,
        outcome_rewards=torch.tensor([ep[2] for ep in EPISODES]), tool_results=tools, turn_obs_keys=keys,
        failed=torch.tensor([ep[4] for ep in EPISODES]), context_cut=torch.zeros(B, dtype=torch.bool),
        episode_index=torch.arange(B), turn_index=torch.full((B,), -1), extra=extra,
    )


def to_turn_layout(traj: RolloutBatch) -> RolloutBatch:
    """One row per turn of ``traj``: the row's tokens up to the turn's last model token, only that turn's tokens on
    the response mask; a failed episode keeps one placeholder row. Per-episode fields are repeated on every row."""
    rows: list[tuple[int, int, int]] = []  # (episode, turn, end position)
    for b in range(traj.batch_size):
        tid = traj.turn_ids[b]
        turns = int(tid.max()) + 1
        if turns == 0:
            rows.append((b, -1, 1))
        for k in range(turns):
            rows.append((b, k, int((tid == k).nonzero()[-1]) + 1))
    T = max(end for _, _, end in rows)
    n = len(rows)
    out = {name: torch.zeros(n, T, dtype=traj.input_ids.dtype) for name in ("input_ids", "attention_mask")}
    tids = torch.full((n, T), -1)
    rewards = torch.zeros(n, T)
    per_token = {name: torch.zeros(n, T) for name in TOKEN_EXTRAS}
    sample = torch.zeros(n, T)
    for r, (b, k, end) in enumerate(rows):
        out["input_ids"][r, :end] = traj.input_ids[b, :end]
        out["attention_mask"][r, :end] = 1
        mine = traj.turn_ids[b, :end] == k
        tids[r, :end] = torch.where(mine, k, -1)
        rewards[r, :end] = torch.where(mine, traj.token_rewards[b, :end], 0.0)
        sample[r, :end] = torch.where(mine, traj.sample_log_probs[b, :end], 0.0)
        for name in TOKEN_EXTRAS:
            x = traj.extra[name][b, :end]
            per_token[name][r, :end] = x if name == "values" else torch.where(mine, x, 0.0)
    ep = torch.tensor([b for b, _, _ in rows])
    extra = {**per_token, "last_values": traj.extra["last_values"][ep]}
    return RolloutBatch(
        input_ids=out["input_ids"], attention_mask=out["attention_mask"], response_mask=(tids >= 0).long(),
        turn_ids=tids, token_rewards=rewards, sample_log_probs=sample,
        group_ids=traj.group_ids[ep], turn_rewards=traj.turn_rewards[ep], num_turns=traj.num_turns[ep],
        truncated=traj.truncated[ep], step_rewards=traj.step_rewards[ep], outcome_rewards=traj.outcome_rewards[ep],
        tool_results=traj.tool_results[ep], turn_obs_keys=[traj.turn_obs_keys[b] for b in ep.tolist()],
        failed=traj.failed[ep], context_cut=torch.zeros(n, dtype=torch.bool), episode_index=ep,
        turn_index=torch.tensor([k for _, k, _ in rows]), extra=extra,
    )


def batch(layout: str) -> RolloutBatch:
    """The fixed batch in ``layout`` (``trajectory`` or ``turn``)."""
    traj = trajectory_batch()
    return traj if layout == "trajectory" else to_turn_layout(traj)
