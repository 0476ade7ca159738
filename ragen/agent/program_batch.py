"""Agent-program episodes -> a ``RolloutBatch`` (docs/gateway.md, "Training a program"; docs/design.md, the token
layout and the two layouts).

Each episode's calls, as the gateway recorded them, become rows through ``ragen.gateway.record.merge_calls``: a
maximal run of calls whose prompts extend the previous call's prompt and sample token for token is one row, and a
call that does not (a *fork*: the template re-rendered history, the program edited an answer...) starts another.
The rows are the agent proxy's :class:`ragen.agent.layout.Row` and are padded as the env proxy pads them
(``ragen.agent.collate.row_tensors``):

* ``trajectory`` (one row per episode): an episode without a fork is its one row. An episode with a fork has no row
  that is what the model saw at every call, so it keeps one row (its last) that trains nothing, as a trajectory row
  whose history was cut does (``context_cut``: masked, out of the group statistics); ``gateway/masked_episodes``
  counts them and ``gateway/forks/<reason>`` says why.
* ``turn``: every row of the merge is a row of the batch (``turn_index`` its place among the episode's rows), so a
  forked episode trains on each of its rows; an episode without a fork is one row here too.

Rewards (:func:`call_turn_rewards`): each trained call's reward sits on its last model token (``token_rewards``,
the turn-reward convention of ``RolloutBatch``; ``turn_rewards[k]`` is trained call ``k``'s). A program that returned
a number gives it to the episode's last trained call (the others get 0); one that returned per-call rewards
(``ragen.gateway.program``) gives each call its own, and the reward of a call that sampled no token goes to the last
trained call. ``format_penalty`` (``env.config.format_penalty``) is added to the reward of every call whose
completion was a malformed tool call (``CallRecord.tool_parse.malformed``). Trained calls (``turn_ids``) are
numbered by ``merge_calls`` (row order, then call order). An episode that failed (its program raised, ran past its
time limit, returned no reward, or got a 400 from the endpoint) keeps its rows with ``failed`` set and trains
nothing, as a failed env episode; an episode without a call has the one-token placeholder row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragen.agent.batch import EpisodeRecord, RolloutBatch, TurnRecord
from ragen.agent.collate import place_turn_rewards, row_tensors
from ragen.agent.layout import Row, placeholder, row_layout
from ragen.gateway.record import CallRecord, EpisodeRows, merge_calls, merge_counters

ENV_NAME = "agent_program"


@dataclass
class ProgramEpisode:
    """One finished program run: its calls in answer order, its reward, whether it failed and why, its group
    (the episodes of a group share task and seed) and seed, the decoded text of each call's sample, and
    ``call_rewards``: the program's reward of each call (same order as ``calls``) when it returned per-call
    rewards, None when it returned a number (``reward``, then its last trained call's)."""

    calls: list[CallRecord]
    reward: float
    failed: bool
    error: str
    group_id: int
    seed: int
    texts: list[str]
    call_rewards: list[float] | None = None


def trained_calls(calls: Sequence[CallRecord], merged: EpisodeRows) -> list[int]:
    """The episode's calls with model tokens, in trained-turn order (``turn_ids`` 0, 1, ...: ``merge_calls``)."""
    return [c for row in merged.rows for c in row.calls if calls[c].sampled_ids]


def call_turn_rewards(ep: ProgramEpisode, trained: Sequence[int], format_penalty: float) -> list[float]:
    """The reward of each of the episode's trained calls, in turn order (``trained``; module docstring): the
    program's reward(s) plus ``format_penalty`` for each call that was a malformed tool call; all 0 when the episode
    failed (it trains nothing)."""
    n = len(trained)
    if ep.failed or not n:
        return [0.0] * n
    if ep.call_rewards is None:
        out = [0.0] * (n - 1) + [ep.reward]
    else:
        out = [ep.call_rewards[c] for c in trained]
        out[-1] += sum(r for c, r in enumerate(ep.call_rewards) if c not in set(trained))
    return [r + (format_penalty if ep.calls[c].tool_parse.malformed else 0.0)
            for r, c in zip(out, trained, strict=True)]


def episode_rows(e: int, ep: ProgramEpisode, merged: EpisodeRows, layout: str, pad_id: int) -> list[Row]:
    """The batch rows of episode ``e`` (module docstring)."""
    if not merged.rows:
        return [placeholder(pad_id, e)]
    return row_layout(layout).call_rows(e, list(merged.rows))


def _obs_key(prompt: Sequence[int]) -> str:
    """A call's prompt as a short key: the state a call acted on (``turn_obs_keys``, GiGPO's anchor states)."""
    return hashlib.blake2b(repr(tuple(prompt)).encode(), digest_size=8).hexdigest()


def _record(ep: ProgramEpisode, trained: list[int], rewards: list[float]) -> EpisodeRecord:
    reward_of = dict(zip(trained, rewards, strict=True))
    turns = [TurnRecord(prompt_text="", response_text=ep.texts[c], actions=[], reward=reward_of.get(c, 0.0),
                        success=False, format_ok=not ep.calls[c].tool_parse.malformed) for c in range(len(ep.calls))]
    return EpisodeRecord(ENV_NAME, ep.seed, ep.group_id, turns, success=not ep.failed and ep.reward > 0,
                         failed=ep.failed, error=ep.error)


def program_batch(episodes: Sequence[ProgramEpisode], layout: str, pad_id: int,
                  format_penalty: float) -> RolloutBatch:
    """The batch of finished program runs in ``layout``'s rows (module docstring), with ``env/agent_program/*``,
    ``gateway/*`` and ``rollout/*`` metrics."""
    merged = [merge_calls(ep.calls) for ep in episodes]
    trained = [trained_calls(ep.calls, m) for ep, m in zip(episodes, merged, strict=True)]
    rewards = [call_turn_rewards(ep, t, format_penalty) for ep, t in zip(episodes, trained, strict=True)]
    rows = [r for e, (ep, m) in enumerate(zip(episodes, merged, strict=True))
            for r in episode_rows(e, ep, m, layout, pad_id)]
    input_ids, attention, turn_ids, log_probs = row_tensors(rows, pad_id)
    b, k_max = len(rows), max(1, max(len(t) for t in trained))
    token_rewards = torch.zeros(input_ids.shape, dtype=torch.float32)
    turn_rewards = torch.zeros((b, k_max), dtype=torch.float32)
    for i, row in enumerate(rows):
        ep, n = episodes[row.episode], len(trained[row.episode])
        turn_rewards[i, :n] = torch.tensor(rewards[row.episode], dtype=torch.float32)
        place_turn_rewards(token_rewards[i], turn_ids[i], turn_rewards[i, :n].tolist())
        if ep.failed or row.masked:  # trains nothing
            turn_ids[i] = -1
            token_rewards[i] = 0.0
    records = [_record(ep, t, r) for ep, t, r in zip(episodes, trained, rewards, strict=True)]
    picked = [episodes[r.episode] for r in rows]
    batch = RolloutBatch(
        input_ids=input_ids, attention_mask=attention, response_mask=(turn_ids >= 0).long(), turn_ids=turn_ids,
        token_rewards=token_rewards, sample_log_probs=log_probs * (turn_ids >= 0),
        group_ids=torch.tensor([ep.group_id for ep in picked], dtype=torch.long), turn_rewards=turn_rewards,
        num_turns=torch.tensor([len(trained[r.episode]) for r in rows], dtype=torch.long),
        truncated=torch.zeros(b, dtype=torch.bool),
        turn_obs_keys=[[_obs_key(episodes[r.episode].calls[c].prompt_ids) for c in trained[r.episode]]
                       for r in rows],
        bootstrap_prompts=[[] for _ in rows], episodes=[records[r.episode] for r in rows],
        failed=torch.tensor([ep.failed for ep in picked], dtype=torch.bool),
        context_cut=torch.tensor([r.masked for r in rows], dtype=torch.bool),
        episode_index=torch.tensor([r.episode for r in rows], dtype=torch.long),
        turn_index=torch.tensor([r.turn for r in rows], dtype=torch.long),
    )
    batch.metrics = program_metrics(episodes, merged, rewards, sum(r.masked for r in rows))
    return batch


def program_metrics(episodes: Sequence[ProgramEpisode], merged: Sequence[EpisodeRows],
                    rewards: Sequence[Sequence[float]], masked: int) -> dict[str, float]:
    """``env/agent_program/{success, reward, turns, failed, format_ok}``: means over all episodes (a failed one
    counts 0 reward and no success; ``reward``: the sum of the episode's call rewards, ``rewards``, format penalties
    included; ``success``: the program's reward > 0), ``failed`` a count, ``format_ok`` the share of calls
    without a malformed tool call; ``gateway/merged_turns``, ``gateway/forks``, ``gateway/forks/<reason>``,
    ``gateway/failed_episodes``, ``gateway/masked_episodes`` (``masked``: trajectory rows of forked episodes),
    ``gateway/calls``; ``rollout/env_errors`` (failed episodes) and ``rollout/context_cut_ratio`` (the masked
    share of the episodes), as the env proxy reports them."""
    n = max(len(episodes), 1)
    ok = [ep for ep in episodes if not ep.failed]
    parses = [c.tool_parse.malformed for ep in episodes for c in ep.calls]
    failed = float(sum(ep.failed for ep in episodes))
    p = f"env/{ENV_NAME}/"
    out = {p + "success": sum(ep.reward > 0 for ep in ok) / n, p + "reward": sum(map(sum, rewards)) / n,
           p + "turns": sum(len(ep.calls) for ep in episodes) / n, p + "failed": failed,
           p + "format_ok": (sum(not m for m in parses) / len(parses)) if parses else 0.0}
    out.update(merge_counters(merged))
    out.update({"gateway/failed_episodes": failed, "gateway/masked_episodes": float(masked),
                "gateway/calls": float(sum(len(ep.calls) for ep in episodes)), "rollout/env_errors": failed,
                "rollout/context_cut_ratio": masked / n})
    return out
