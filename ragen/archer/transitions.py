"""Between rollouts and the ArCHer learners: turn rows -> replay records, and records -> worker batches.

A ``turn``-layout ``RolloutBatch`` (``agent.layout=turn``) holds one row per generated turn with the exact prompt
the model saw, so each row gives one (s, a, r, s', done) record without re-rendering anything. The critic reads
texts (the decoded prompt = s, the decoded response = a); the actor trains on the stored token ids.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ragen.agent.batch import RolloutBatch
from ragen.algorithms.archer import monte_carlo_returns
from ragen.archer.buffer import Transition
from ragen.workers.data import TrainBatch


def _split_row(ids: torch.Tensor, resp: torch.Tensor, attn: torch.Tensor) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of one turn row. A row without model tokens (the turn's response was empty) is
    ``[prompt][end-of-turn]`` (``ragen.agent.collate``): its prompt is the attended ids but the closing token."""
    pos = resp.nonzero().flatten()
    if len(pos) == 0:
        return ids[:max(int(attn.sum()) - 1, 0)].tolist(), []
    first, last = int(pos[0]), int(pos[-1])
    return ids[:first].tolist(), ids[first:last + 1].tolist()


def transitions_from_batch(batch: RolloutBatch, decode: Callable[[list[int]], str], gamma: float,
                           first_episode: int = 0) -> tuple[list[Transition], list[float]]:
    """Records of every turn of ``batch`` (turn layout) and the total reward of each complete episode.

    Failed episodes (the env raised) are skipped. An episode has ``num_turns`` turns (env steps), one row each;
    only its last turn is ``done``, unless the episode was cut by a length budget (``truncated``: the critic
    bootstraps from V(s')), and its s' is the context after the response. Every other turn bootstraps from the
    next turn's prompt, also when that turn's response was empty (a record with no action tokens: the critic
    still learns its reward; BC skips it). ``first_episode`` numbers the episodes run-wide.
    """
    if batch.turn_index is None or batch.episode_index is None:
        raise ValueError("ArCHer needs agent.layout=turn (one row per turn with the exact prompt the model saw)")
    ep_idx, turn_idx = batch.episode_index.tolist(), batch.turn_index.tolist()
    failed = (torch.zeros(batch.batch_size, dtype=torch.bool) if batch.failed is None else batch.failed).tolist()
    rows: dict[int, dict[int, tuple[list[int], list[int]]]] = {}
    first_row: dict[int, int] = {}
    for i, (e, k) in enumerate(zip(ep_idx, turn_idx, strict=True)):
        first_row.setdefault(e, i)
        if k < 0 or failed[i]:
            continue
        rows.setdefault(e, {})[k] = _split_row(batch.input_ids[i], batch.response_mask[i], batch.attention_mask[i])
    out: list[Transition] = []
    traj_rewards: list[float] = []
    for n, e in enumerate(sorted(first_row)):
        i = first_row[e]
        if failed[i] or e not in rows:
            continue
        nt = int(batch.num_turns[i])
        missing = sorted(set(range(nt)) - set(rows[e]))
        if missing:
            raise ValueError(f"episode {e} has {nt} turns but no row for turn(s) {missing}; a turn-layout batch "
                             "holds one row per turn")
        rewards = [float(r) for r in batch.turn_rewards[i, :nt]]
        returns = monte_carlo_returns(rewards, gamma)
        total = float(sum(rewards))
        traj_rewards.append(total)
        turns = rows[e]
        for k in range(nt):
            prompt, action = turns[k]
            last = k == nt - 1
            nxt = prompt + action if last else turns[k + 1][0]
            out.append(Transition(state=decode(prompt), action=decode(action), reward=rewards[k],
                                  next_state=decode(nxt), done=last and not bool(batch.truncated[i]),
                                  traj_reward=total, mc_return=returns[k], prompt_ids=list(prompt),
                                  action_ids=list(action), episode=first_episode + n, turn=k))
    return out, traj_rewards


def policy_batch(prompts: list[list[int]], actions: list[list[int]], pad_id: int,
                 advantages: torch.Tensor | None = None, log_probs: list[list[float]] | None = None) -> TrainBatch:
    """Right-padded ``[prompt][action]`` rows with the response mask on the action tokens.

    advantages: (N,) utterance advantage per row, broadcast over its action tokens (``TrainBatch.advantages``,
    0 elsewhere); log_probs: per action token, the sampler's log-probs (``old_log_probs``, for the optional clip).
    """
    n = len(prompts)
    T = max(len(p) + len(a) for p, a in zip(prompts, actions, strict=True))
    ids = torch.full((n, T), pad_id, dtype=torch.long)
    attn = torch.zeros((n, T), dtype=torch.long)
    resp = torch.zeros((n, T), dtype=torch.long)
    old = torch.zeros((n, T), dtype=torch.float32)
    for i, (p, a) in enumerate(zip(prompts, actions, strict=True)):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a, dtype=torch.long)
        attn[i, :len(p) + len(a)] = 1
        resp[i, len(p):len(p) + len(a)] = 1
        if log_probs is not None:
            old[i, len(p):len(p) + len(a)] = torch.tensor(log_probs[i][:len(a)], dtype=torch.float32)
    adv = None if advantages is None else advantages.float().unsqueeze(1) * resp.float()
    return TrainBatch(input_ids=ids, attention_mask=attn, response_mask=resp, advantages=adv,
                      old_log_probs=old if log_probs is not None else None)
