"""Typed records for what a rollout produces (docs/design.md, the token layout).

One trajectory is one token sequence built from the exact ids the engine sampled::

    [prompt] [turn 0 model tokens] [env obs tokens] [turn 1 model tokens] ... [pad]

Sequences are right-padded with the tokenizer's pad id. All (B, T) tensors share that layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class TurnRecord:
    """One turn of one episode, kept for logging and validation dumps (not used by the estimators)."""

    prompt_text: str  # the new text the model saw this turn (observation + instructions), not the history
    response_text: str
    actions: list[str]
    reward: float
    success: bool
    format_ok: bool
    step_reward: float = 0.0


@dataclass
class EpisodeRecord:
    """Per-episode summary: which env, which seed, its turns, and its outcome."""

    env_name: str
    seed: int
    group_id: int
    turns: list[TurnRecord] = field(default_factory=list)
    success: bool = False
    failed: bool = False  # the env raised; its error is in ``error``
    error: str = ""
    truncated: bool = False


@dataclass
class RolloutBatch:
    """The batch the trainer consumes.

    Per token, shape (B, T), right-padded:
      input_ids (long), attention_mask (long, 1 on real tokens), response_mask (long, 1 on model-generated
      tokens only), turn_ids (long, k on model tokens of turn k, -1 elsewhere), token_rewards (float, the
      turn's reward on the turn's last model token, 0 elsewhere), sample_log_probs (float, the engine's
      log-prob of each model token, 0 elsewhere).
    Per trajectory: group_ids (B,) long (same env seed = same group), turn_rewards (B, K) float (0 past the
      last turn), num_turns (B,) long, truncated (B,) bool (cut by a length budget, ``max_model_len``, while
      the episode went on: the GAE family bootstraps it; rows that end by the env or by max_turn are terminal),
      step_rewards (B, K) / outcome_rewards (B,) float when the env reports a step/outcome split (else None),
      tool_results (B, K) bool with them: turn k received a tool result (the env's ``info["tool_result"]``;
      False past the last turn), which places MS-GRPO / MS-PO's step credit,
      turn_obs_keys (the observation text each turn acted on, for gigpo), bootstrap_prompts (per row, the ids of the
      state a ``truncated`` episode bootstraps from: its next generation prompt cut to the length budget,
      ``EpisodeContext.bootstrap_prompt``, the same on every row of the episode in both layouts; [] for episodes
      that ended).
    Per row, shape (B,), where the rollout maps rows to episodes (``ragen.agent.collate``; None on hand-built
      batches that do not): failed (bool, the row's episode failed: the env raised, hung or returned garbage; its
      rows train nothing), context_cut (bool, some prompt of the row's episode had history cut by
      ``max_context_window`` / ``max_model_len``), episode_index (long, the row's episode: its slot in the rollout;
      the ``turn`` layout's turn rows of one episode share it), turn_index (long, the row's turn in the ``turn``
      layout, -1 for a whole-episode row or a placeholder).
    ``sample_versions`` (B, T) long, where the engine stamps versions (``ragen.rollout.versioned``; else None or -1):
      the policy version (complete training steps of the weights the engine held) that sampled each model token,
      -1 off model tokens; asynchronous training measures staleness from it (``ragen.ppo.async_rollout``).
    ``metrics`` holds namespaced rollout metrics such as ``env/<name>/success``; ``extra`` holds a caller's own
    per-row entries (tensors or lists of length B are kept aligned by :meth:`select`).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    turn_ids: torch.Tensor
    token_rewards: torch.Tensor
    sample_log_probs: torch.Tensor
    group_ids: torch.Tensor
    turn_rewards: torch.Tensor
    num_turns: torch.Tensor
    truncated: torch.Tensor
    step_rewards: torch.Tensor | None = None
    outcome_rewards: torch.Tensor | None = None
    tool_results: torch.Tensor | None = None
    turn_obs_keys: list[list[str]] | None = None
    bootstrap_prompts: list[list[int]] | None = None
    failed: torch.Tensor | None = None
    context_cut: torch.Tensor | None = None
    episode_index: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None
    sample_versions: torch.Tensor | None = None
    episodes: list[EpisodeRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def select(self, index: torch.Tensor | list[int]) -> RolloutBatch:
        """Rows ``index`` of the batch (used by rollout filtering and mini-batching)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[idx]

        return RolloutBatch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            response_mask=self.response_mask[idx],
            turn_ids=self.turn_ids[idx],
            token_rewards=self.token_rewards[idx],
            sample_log_probs=self.sample_log_probs[idx],
            group_ids=self.group_ids[idx],
            turn_rewards=self.turn_rewards[idx],
            num_turns=self.num_turns[idx],
            truncated=self.truncated[idx],
            step_rewards=pick(self.step_rewards),
            outcome_rewards=pick(self.outcome_rewards),
            tool_results=pick(self.tool_results),
            turn_obs_keys=None if self.turn_obs_keys is None else [self.turn_obs_keys[i] for i in rows],
            bootstrap_prompts=None if self.bootstrap_prompts is None else [self.bootstrap_prompts[i] for i in rows],
            failed=pick(self.failed),
            context_cut=pick(self.context_cut),
            episode_index=pick(self.episode_index),
            turn_index=pick(self.turn_index),
            sample_versions=pick(self.sample_versions),
            episodes=[self.episodes[i] for i in rows] if self.episodes else [],
            metrics=dict(self.metrics),
            extra={k: _select_rows(v, idx, self.batch_size) for k, v in self.extra.items()},
        )


def _select_rows(value: Any, idx: torch.Tensor, batch_size: int) -> Any:
    """Pick rows ``idx`` of a per-row entry of ``RolloutBatch.extra`` (tensor or list of length B); others pass."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch_size:
        return value[idx]
    if isinstance(value, list) and len(value) == batch_size:
        return [value[i] for i in idx.tolist()]
    return value


def episode_record(ep: EpisodeRecord) -> dict:
    """One episode as a JSON-ready dict: env, seed, group, success and per turn prompt / response / actions / reward."""
    return {
        "env": ep.env_name, "seed": ep.seed, "group_id": ep.group_id, "success": bool(ep.success),
        "failed": bool(ep.failed), "error": ep.error, "truncated": bool(ep.truncated),
        "turns": [{"prompt": t.prompt_text, "response": t.response_text, "actions": list(t.actions),
                   "reward": float(t.reward), "success": bool(t.success), "format_ok": bool(t.format_ok)}
                  for t in ep.turns],
    }


def episode_records(batch: RolloutBatch) -> list[dict]:
    """JSON-ready episodes (:func:`episode_record`) of ``batch.episodes``, each once (the turn layout lists an
    episode once per turn row)."""
    return [episode_record(ep) for ep in {id(ep): ep for ep in batch.episodes}.values()]


def failed_episode_records(batch: RolloutBatch, step: int) -> list[dict]:
    """``{"step", "env", "seed", "group_id", "error"}`` of each failed (masked) episode of a rollout."""
    return [{"step": step, "env": ep.env_name, "seed": ep.seed, "group_id": ep.group_id, "error": ep.error}
            for ep in batch.episodes if ep.failed]
