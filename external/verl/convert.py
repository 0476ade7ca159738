"""A ragen episode (one row of a ``RolloutBatch``) as the fields of verl's ``AgentLoopOutput``. Pure: no verl import.

ragen's trajectory row (ragen/agent/batch.py; docs/design.md, the token layout) is one token sequence::

    [prompt] [turn 0 model tokens] [env obs tokens] [turn 1 model tokens] ... [closing end-of-turn?] [pad]

verl's agent loop (verl 0.9.1, ``verl.experimental.agent_loop.agent_loop.AgentLoopOutput``) splits the same
sequence into ``prompt_ids`` (what the model saw before its first token) and ``response_ids`` (everything after,
model and env tokens alike) with ``response_mask`` 1 on model tokens and 0 on env tokens. The mapping:

* ``prompt_ids``   = the row's ids before its first model token (turn 0's exact prompt, incl. any response prefix);
* ``response_ids`` = the ids from the first to the *last model token*; ``response_mask`` = ragen's response mask
  there (env observation tokens and end-of-turn tokens ragen appended keep 0). Tokens after the last model token
  (the end-of-turn id ragen appends when a response stopped at the answer tag or the budget; mask 0, nothing
  follows them) are dropped: verl puts ``reward_score`` on the last response token and its GAE skips the rewards
  of masked positions, so the response must end on a model token for the reward to count;
* ``token_rewards`` (response-relative, same length as ``response_ids``): each turn's reward on the turn's last
  model token, 0 elsewhere (ragen's placement, unchanged); ``reward_score`` = their sum (verl's stock path puts
  it on the last response token: right for the outcome-level estimators, not for GAE with per-turn rewards, so
  ``RagenAgentLoopOutput.as_dict`` and ``manager.RagenAgentLoopWorker`` hand verl ``token_rewards`` instead);
  ``reward_positions[k]`` = index in ``response_ids`` of turn k's last model token;
* ``response_logprobs`` = the engine's sampling log-probs on model tokens, 0 on env tokens;
* ``num_turns`` = 2 * K for K model turns (verl counts chat messages: one user + one assistant message per turn).

A failed episode (the env raised; ragen masks its row) has no model tokens: empty response, reward 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ragen.agent.batch import RolloutBatch


@dataclass
class VerlEpisode:
    """One ragen episode in verl's agent-loop terms (lists, unpadded; see the module docstring)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    token_rewards: list[float]
    reward_positions: list[int]
    turn_rewards: list[float]
    reward_score: float
    num_turns: int
    metrics: dict[str, float] = field(default_factory=dict)


def episode_to_agent_loop_output(batch: RolloutBatch, row: int = 0) -> VerlEpisode:
    """The verl agent-loop fields of trajectory row ``row`` of ``batch`` (a ``layout="trajectory"`` batch)."""
    n = int(batch.attention_mask[row].sum())
    ids = batch.input_ids[row, :n].tolist()
    mask = batch.response_mask[row, :n]
    turn_ids = batch.turn_ids[row, :n]
    k = int(batch.num_turns[row])
    episode = batch.episodes[row] if batch.episodes else None
    failed = bool(batch.extra["failed"][row]) if "failed" in batch.extra else False
    metrics = {
        "success": float(bool(episode and episode.success)),
        "failed": float(failed),
        "truncated": float(bool(batch.truncated[row])),
        "turns": float(k),
    }
    model = mask.nonzero().flatten()
    if model.numel() == 0:
        return VerlEpisode(ids, [], [], [], [], [], [0.0] * k, 0.0, 2 * k, metrics)
    start, end = int(model[0]), int(model[-1]) + 1
    rewards = batch.token_rewards[row, start:end].tolist()
    positions = []
    for turn in range(k):
        pos = (turn_ids[start:end] == turn).nonzero().flatten()
        if pos.numel():
            positions.append(int(pos[-1]))
    return VerlEpisode(
        prompt_ids=ids[:start],
        response_ids=ids[start:end],
        response_mask=mask[start:end].tolist(),
        response_logprobs=batch.sample_log_probs[row, start:end].tolist(),
        token_rewards=rewards,
        reward_positions=positions,
        turn_rewards=batch.turn_rewards[row, :k].tolist(),
        reward_score=float(sum(rewards)),
        num_turns=2 * k,
        metrics=metrics,
    )


def turn_level_rm_scores(token_rewards: list[list[float]], response_length: int) -> torch.Tensor:
    """(B, response_length) float: ragen's per-turn reward placement as verl's ``rm_scores`` (right-padded).

    ``token_rewards[b]``: row b's response-relative rewards (``non_tensor_batch["ragen_token_rewards"]`` after
    verl's agent loop). Replace ``batch["rm_scores"]`` with this to train on per-turn rewards; verl's stock
    ``rm_scores`` hold only the total on the last response token.
    """
    out = torch.zeros(len(token_rewards), response_length, dtype=torch.float32)
    for b, rewards in enumerate(token_rewards):
        if len(rewards) > response_length:
            raise ValueError(f"row {b}: {len(rewards)} response tokens exceed response_length={response_length}")
        out[b, : len(rewards)] = torch.tensor(list(rewards), dtype=torch.float32)
    return out


def place_turn_rewards(rm_scores: torch.Tensor, response_lengths: torch.Tensor,
                       token_rewards: Sequence[Sequence[float] | None]) -> torch.Tensor:
    """verl's batched ``rm_scores`` with ragen's rows moved to ragen's per-turn placement (a new tensor).

    rm_scores: (B, T) float32, verl's: row b's ``reward_score`` on its last response token, responses right-padded
    to T; response_lengths: (B,) int, row b's unpadded response length; token_rewards[b]: row b's
    ``ragen_token_rewards`` (response-relative, length response_lengths[b]) or None for a row that no ragen loop
    made, which is returned unchanged. Turn k's reward lands on turn k's last model token, padding stays 0, and a
    row's sum is unchanged (checked: a mismatch means the score was changed after the loop, e.g. by a reward
    model, and the per-turn rewards no longer describe it).
    """
    out = rm_scores.clone()
    rows = [b for b, r in enumerate(token_rewards) if r is not None]
    if not rows:
        return out
    for b in rows:
        if len(token_rewards[b]) != int(response_lengths[b]):
            raise ValueError(f"row {b}: {len(token_rewards[b])} ragen_token_rewards for a response of "
                             f"{int(response_lengths[b])} tokens")
    out[rows] = turn_level_rm_scores([token_rewards[b] for b in rows], rm_scores.shape[1])
    before, after = rm_scores[rows].double().sum(1), out[rows].double().sum(1)
    bad = (before - after).abs() > 1e-5 * before.abs().clamp(min=1.0)
    if bad.any():
        b = rows[int(bad.nonzero()[0])]
        raise ValueError(f"row {b}: rm_scores sum {float(rm_scores[b].sum())} != the sum of its ragen_token_rewards "
                         f"{float(out[b].sum())}; the reward was changed after the ragen agent loop")
    return out
