"""Turn finished episodes into a right-padded ``RolloutBatch`` and its namespaced metrics.

Layouts (docs/design.md, the two layouts of a rollout; each makes its rows in ``ragen.agent.layout``):

* ``trajectory``: one row per episode, ``[prompt][turn 0][env][turn 1]...`` built from the exact sampled ids.
  When ``max_context_window`` or ``max_model_len`` cut a prompt, the row still holds the full history, so
  for those turns it differs from what the model saw (``RolloutBatch.context_cut`` flags such rows). Such a row
  trains nothing (like a failed episode: ``turn_ids`` -1, hence ``response_mask`` 0, and ``token_rewards`` 0),
  since its log-probs and values would be of a context the model never saw; ``rollout/context_cut_ratio``
  counts the cut episodes and the first cut batch of a run warns once, recommending ``agent.layout=turn``.
* ``turn``: one row per generated turn: the exact prompt the model saw + its response. Per-episode fields
  (``group_ids``, ``turn_rewards``, ``num_turns``, ``truncated``, ``turn_obs_keys``, ``episodes``) are
  repeated on every row of the episode; ``RolloutBatch.episode_index`` / ``turn_index`` (B,) map rows
  back to episodes so a trainer can gather each episode's model tokens in order.

An episode that failed before its first turn has a one-token placeholder row (pad id, attention 1, no
model token), so every episode keeps a row and attention never covers an empty row.

Turn ids number the turns that have model tokens, 0..n-1 in order (the estimators' contract). A turn whose response
has no token (an engine that returned an empty sample) is no decision the trainer can credit: its rewards are
merged into the previous turn with tokens (into the first one for leading empty turns), so every reward still
reaches the estimators; the per-turn fields (``turn_rewards``, ``step_rewards``, ``tool_results``,
``turn_obs_keys``) are indexed by that turn id (``num_turns`` still counts the env's turns). Without empty
turns the numbering is the env's.
"""

from __future__ import annotations

import warnings
from collections import defaultdict

import torch

from ragen.agent.batch import RolloutBatch
from ragen.agent.context import EpisodeContext
from ragen.agent.env_manager import EnvSlot
from ragen.agent.layout import Row, RowLayout, turn_map

# Warn-once flags of this process (one training run).
_state = {"warned_context_cut": False}


def _merged(values: list, index: list[int], width: int, combine=sum) -> list:
    """Per-turn ``values`` (one per env turn) regrouped by trained turn id (``index``), ``width`` long."""
    groups: list[list] = [[] for _ in range(width)]
    for v, t in zip(values, index, strict=False):
        groups[t].append(v)
    return [combine(g) if g else 0 for g in groups]


def build_batch(
    slots: list[EnvSlot], contexts: list[EpisodeContext | None], pad_id: int, layout: RowLayout,
    max_len: int | None = None, bootstrap: list[list[int]] | None = None,
) -> RolloutBatch:
    """The batch of ``slots``' finished episodes in ``layout``'s rows (``ragen.agent.layout``); rows are at most
    ``max_len`` tokens (``max_model_len``; None = no limit). ``bootstrap``: per episode, the prompt a truncated
    episode bootstraps from (``EpisodeContext.bootstrap_prompt``; [] for episodes that ended), repeated on every
    row of the episode as ``RolloutBatch.bootstrap_prompts``."""
    rows = layout.rows(contexts, pad_id, max_len or (1 << 62))
    cut = [contexts[r.episode] is not None and contexts[r.episode].history_cut for r in rows]
    masked = [r.masked for r in rows]  # not what the model saw (a cut trajectory row)
    maps = [turn_map(ctx, len(slot.turn_rewards)) for slot, ctx in zip(slots, contexts, strict=True)]
    b = len(rows)
    k_max = max(1, max(len(s.turn_rewards) for s in slots))
    input_ids, attention, turn_ids, log_probs = row_tensors(rows, pad_id)
    token_rewards = torch.zeros(input_ids.shape, dtype=torch.float32)
    turn_rewards = torch.zeros((b, k_max), dtype=torch.float32)
    step_rewards = torch.zeros((b, k_max), dtype=torch.float32)
    tool_results = torch.zeros((b, k_max), dtype=torch.bool)
    for i, row in enumerate(rows):
        slot, tmap = slots[row.episode], maps[row.episode]
        turn_rewards[i] = torch.tensor(_merged(slot.turn_rewards, tmap, k_max), dtype=torch.float32)
        step_rewards[i] = torch.tensor(_merged(slot.step_rewards, tmap, k_max), dtype=torch.float32)
        tool_results[i] = torch.tensor(_merged(slot.tool_results, tmap, k_max, any), dtype=torch.bool)
        place_turn_rewards(token_rewards[i], turn_ids[i], turn_rewards[i, : max(tmap, default=-1) + 1].tolist())
        if slot.failed or masked[i]:  # trains nothing (failed: module docstring of ragen.agent.rollout)
            turn_ids[i] = -1
            token_rewards[i] = 0.0
    episode = torch.tensor([r.episode for r in rows], dtype=torch.long)
    picked = [slots[r.episode] for r in rows]
    # the split exists when the env declares it, even if no turn of this batch got to step the env
    split = any(s.has_split or getattr(s.env, "STEP_OUTCOME_SPLIT", False) for s in slots)
    metrics = env_metrics(slots)
    metrics["rollout/context_cut_ratio"] = _context_cut_ratio(contexts)
    if any(masked):
        _warn_context_cut(sum(masked), len(rows))
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=(turn_ids >= 0).long(),
        turn_ids=turn_ids,
        token_rewards=token_rewards,
        sample_log_probs=log_probs * (turn_ids >= 0),
        group_ids=torch.tensor([s.group_id for s in picked], dtype=torch.long),
        turn_rewards=turn_rewards,
        num_turns=torch.tensor([len(s.turn_rewards) for s in picked], dtype=torch.long),
        truncated=torch.tensor([bool(s.record and s.record.truncated) for s in picked], dtype=torch.bool),
        step_rewards=step_rewards if split else None,
        outcome_rewards=torch.tensor([s.outcome_reward for s in picked], dtype=torch.float32) if split else None,
        tool_results=tool_results if split else None,
        turn_obs_keys=[_first_keys(slots[r.episode].obs_keys, maps[r.episode]) for r in rows],
        bootstrap_prompts=None if bootstrap is None else [list(bootstrap[r.episode]) for r in rows],
        episodes=[s.record for s in picked if s.record is not None],
        metrics=metrics,
        failed=torch.tensor([s.failed for s in picked], dtype=torch.bool),
        context_cut=torch.tensor(cut, dtype=torch.bool),
        episode_index=episode,
        turn_index=torch.tensor([r.turn for r in rows], dtype=torch.long),
        sample_versions=token_versions(rows, contexts, turn_ids),
    )


def token_versions(rows: list[Row], contexts: list[EpisodeContext | None], turn_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) long: the policy version that sampled each model token (``EpisodeContext.turn_versions`` of the
    response its trained turn id came from), -1 off model tokens (``turn_ids`` -1, which includes the rows that train
    nothing) and where the engine stamps no version."""
    out = torch.full(turn_ids.shape, -1, dtype=torch.long)
    for i, row in enumerate(rows):
        ctx = contexts[row.episode]
        if ctx is None or not ctx.turn_versions:
            continue
        tmap = turn_map(ctx, ctx.num_turns)
        by_turn = {tmap[k]: v for k, ((resp, _), v) in enumerate(zip(ctx.responses, ctx.turn_versions, strict=True))
                   if resp}
        table = torch.tensor([by_turn.get(k, -1) for k in range(max(by_turn, default=-1) + 1)] + [-1],
                             dtype=torch.long)  # the last entry serves turn id -1
        out[i] = table[turn_ids[i]]
    return out


def row_tensors(rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rows`` right-padded to the longest: (input_ids long, attention_mask long, turn_ids long, log_probs float),
    each (B, T), with ``pad_id`` / 0 / -1 / 0.0 past a row's end (``RolloutBatch``'s positions)."""
    b, t = len(rows), max(len(r.ids) for r in rows)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)
    attention = torch.zeros((b, t), dtype=torch.long)
    turn_ids = torch.full((b, t), -1, dtype=torch.long)
    log_probs = torch.zeros((b, t), dtype=torch.float32)
    for i, row in enumerate(rows):
        n = len(row.ids)
        input_ids[i, :n] = torch.tensor(row.ids, dtype=torch.long)
        attention[i, :n] = 1
        turn_ids[i, :n] = torch.tensor(row.turn_ids, dtype=torch.long)
        log_probs[i, :n] = torch.tensor(row.log_probs, dtype=torch.float32)
    return input_ids, attention, turn_ids, log_probs


def place_turn_rewards(token_rewards: torch.Tensor, turn_ids: torch.Tensor, rewards: list[float]) -> None:
    """Write turn ``k``'s reward ``rewards[k]`` on the last token of one row (``token_rewards``, (T,)) whose
    ``turn_ids`` is ``k`` (the turn's last model token, ``RolloutBatch.token_rewards``); turns without a token in
    the row place nothing."""
    for k, r in enumerate(rewards):
        pos = (turn_ids == k).nonzero()
        if len(pos):
            token_rewards[int(pos[-1])] = r


def _first_keys(keys: list[str], index: list[int]) -> list[str]:
    """The observation each trained turn acted on: that of its first env turn with model tokens (the decision)."""
    out: dict[int, str] = {}
    for key, t in zip(keys, index, strict=False):
        out.setdefault(t, key)
    return [out[t] for t in sorted(out)]


def _context_cut_ratio(contexts: list[EpisodeContext | None]) -> float:
    """Fraction of episodes with some turn generated from a prompt that did not hold the full history."""
    return sum(ctx is not None and ctx.history_cut for ctx in contexts) / max(len(contexts), 1)


def _warn_context_cut(n_cut: int, n_rows: int) -> None:
    """Once per run: trajectory rows are being masked out because their history was cut."""
    if _state["warned_context_cut"]:
        return
    _state["warned_context_cut"] = True
    warnings.warn(
        f"{n_cut} of {n_rows} trajectory rows had history cut from a prompt (agent.max_model_len or "
        "agent.max_context_window), so a row is not what the model saw at every turn; those rows are masked out of "
        "training (metric rollout/context_cut_ratio). Use agent.layout=turn to train on the exact per-turn prompts, "
        "or raise agent.max_model_len (this warning is shown once per run)",
        UserWarning,
        stacklevel=3,
    )


def env_metrics(slots: list[EnvSlot]) -> dict[str, float]:
    """Per-env-name means: success, valid/effective action ratios, turns, format_ok, reward; failed count.

    Action ratios count a malformed turn as one invalid, ineffective action.
    """
    by_name: dict[str, list[EnvSlot]] = defaultdict(list)
    for slot in slots:
        by_name[slot.name].append(slot)
    out: dict[str, float] = {}
    for name, group in by_name.items():
        n = len(group)
        ratio = [(s.actions_valid / s.actions_total, s.actions_effective / s.actions_total)
                 for s in group if s.actions_total > 0]  # fmt: skip
        turns = [t for s in group if s.record for t in s.record.turns]
        p = f"env/{name}/"
        out[p + "success"] = sum(bool(s.record and s.record.success) for s in group) / n
        out[p + "valid_action_ratio"] = sum(v for v, _ in ratio) / len(ratio) if ratio else 0.0
        out[p + "effective_action_ratio"] = sum(e for _, e in ratio) / len(ratio) if ratio else 0.0
        out[p + "turns"] = sum(len(s.turn_rewards) for s in group) / n
        out[p + "format_ok"] = sum(t.format_ok for t in turns) / len(turns) if turns else 0.0
        out[p + "reward"] = sum(sum(s.turn_rewards) for s in group) / n
        out[p + "failed"] = float(sum(s.failed for s in group))
    return out
