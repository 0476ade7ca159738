"""What every advantage estimator reads: :class:`AdvantageInputs` and its validation.

Layout (docs/design.md, the token layout)::

    [prompt] [turn 0 model tokens] [env obs tokens] [turn 1 model tokens] ... [pad]

Left or right padding both work: estimators locate model tokens through ``response_mask`` and turns through
``turn_ids``; they never assume where a sequence starts or ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class AdvantageInputs:
    """Per-token and per-trajectory tensors of one batch of B trajectories of T tokens.

    Per token, shape (B, T):
      token_rewards: float. The env reward of turn k sits on the last model token of turn k. Rewards outside
        ``response_mask`` are ignored.
      response_mask: 1 on model-generated tokens, 0 on prompt, env observation and pad tokens.
      turn_ids: long. k on the model tokens of turn k (0-based, numbered 0..n-1 in sequence order), -1 elsewhere.
      values: float critic values, or None (required by the GAE family). ``values[:, t]`` is V of the context
        *before* token t (the critic's head on the hidden state at t - 1, where the policy's log-prob of token t
        comes from; ``values[:, 0] = 0``). Only values on model tokens are read (with
        ``skip_env_tokens=False``, also between a row's first and last model token).
      token_penalties: optional float per-token terms on model tokens, e.g. the KL-in-reward penalty
        -coef * KL_t. Token-level recursions apply them at their own tokens; turn-level ones sum them into the
        turn reward (``bilevel_gae`` keeps them at the low level and r_k = the env reward only).
      attention_mask: optional, 1 on real (non-pad) tokens (kept for callers; the estimators do not need it).
    Per trajectory, shape (B,):
      group_ids: long, trajectories sharing an env seed (group-relative estimators).
      truncated: bool, the row was cut by a length budget (``max_model_len`` / prompt overflow) while the
        episode went on: the GAE family bootstraps it from ``bootstrap_values``. Rows that ended, by the env or
        by ``max_turn`` (the prompt tells the agent how many turns are left), are terminal: next value 0.
      bootstrap_values: float, V of the state that followed the row's last response: the episode's next
        generation prompt cut to the length budget, evaluated by the critic on its own (no position of ``values``
        holds it; ``ragen.ppo.truncation``). Read only for truncated rows.
      failed: bool, the episode's env raised (its row is masked out): excluded from group statistics.
      outcome_rewards: float outcome reward R^O (ms_grpo / ms_po).
    Per turn:
      step_rewards: (B, K) float step reward R^T of each turn (ms_grpo / ms_po), 0 past the last turn.
      tool_results: (B, K) bool, turn k received a tool result: the env's explicit per-turn flag (``tool_result``
        in its step info), never inferred from the step reward (ms_grpo / ms_po); False past the last turn.
      turn_obs_keys: turn_obs_keys[b][k] is the observation text turn k of row b acted on (gigpo).
    """

    token_rewards: Tensor
    response_mask: Tensor
    turn_ids: Tensor
    values: Tensor | None = None
    group_ids: Tensor | None = None
    truncated: Tensor | None = None
    step_rewards: Tensor | None = None
    outcome_rewards: Tensor | None = None
    tool_results: Tensor | None = None
    turn_obs_keys: list[list[str]] | None = None
    attention_mask: Tensor | None = None
    bootstrap_values: Tensor | None = None
    token_penalties: Tensor | None = None
    failed: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.token_rewards.shape[0])

    @property
    def num_turns(self) -> Tensor:
        """(B,) long: number of turns of each row (max turn id + 1, 0 for a row without model tokens)."""
        if self.turn_ids.shape[1] == 0:
            return torch.zeros(self.turn_ids.shape[0], dtype=torch.long, device=self.turn_ids.device)
        return self.turn_ids.amax(dim=1).clamp(min=-1) + 1

    def validate(self, needs: tuple[str, ...] = ()) -> None:
        """Check shapes, dtypes and the turn-id contract; ``needs`` names optional fields that must be set (and,
        for ``step_rewards`` / ``tool_results`` / ``turn_obs_keys``, be long enough for every row's turns). A batch
        with truncated rows needs ``bootstrap_values`` wherever it needs ``values``. Raises ValueError naming the
        bad field and what it should be.
        """
        _check_token_tensors(self)
        for name in needs:
            if getattr(self, name) is None:
                raise ValueError(
                    f"AdvantageInputs.{name} is None but this estimator needs it; "
                    f"set it (see AdvantageInputs docstring) or choose another estimator"
                )
        if "values" in needs and self.truncated is not None and bool(self.truncated.any()):
            if self.bootstrap_values is None:
                raise ValueError(
                    "AdvantageInputs.bootstrap_values is None but some rows are truncated: pass the critic's value "
                    "of each truncated episode's next generation prompt (ragen.ppo.truncation.bootstrap_values)"
                )
        _check_row_tensors(self, needs)
        _check_turn_contract(self.turn_ids, self.response_mask)

    def bootstrap(self) -> Tensor:
        """(B,) value to bootstrap from after a row's last step: ``bootstrap_values`` on truncated rows, else 0."""
        out = torch.zeros(self.batch_size, dtype=torch.float64, device=self.token_rewards.device)
        if self.truncated is None or self.bootstrap_values is None:
            return out
        return torch.where(self.truncated.bool(), self.bootstrap_values.to(torch.float64), out)

    def rewards_with_penalties(self) -> Tensor:
        """(B, T) ``token_rewards + token_penalties`` (the per-token reward of critic-free estimators)."""
        if self.token_penalties is None:
            return self.token_rewards
        return self.token_rewards + self.token_penalties


def _check_token_tensors(inp: AdvantageInputs) -> None:
    r = inp.token_rewards
    if not isinstance(r, Tensor) or r.dim() != 2:
        raise ValueError(f"token_rewards must be a (B, T) tensor, got {_desc(r)}")
    for name in ("response_mask", "turn_ids", "values", "attention_mask", "token_penalties"):
        t = getattr(inp, name)
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != tuple(r.shape)):
            raise ValueError(f"{name} must have the shape of token_rewards {tuple(r.shape)}, got {_desc(t)}")
    if inp.turn_ids.is_floating_point():
        raise ValueError(f"turn_ids must be an integer tensor (k on turn k, -1 elsewhere), got {inp.turn_ids.dtype}")


def _check_row_tensors(inp: AdvantageInputs, needs: tuple[str, ...]) -> None:
    """Shapes of the per-trajectory fields; per-turn fields are checked against the turn count (a (B, T)
    reduction) only when the estimator ``needs`` them: an estimator that ignores them cannot misuse them."""
    B = inp.batch_size
    for name in ("group_ids", "truncated", "outcome_rewards", "bootstrap_values", "failed"):
        t = getattr(inp, name)
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != (B,)):
            raise ValueError(f"{name} must be a ({B},) tensor (one entry per trajectory), got {_desc(t)}")
    per_turn = [n for n in ("step_rewards", "tool_results") if getattr(inp, n) is not None and n in needs]
    check_keys = inp.turn_obs_keys is not None and "turn_obs_keys" in needs
    if not (per_turn or check_keys):
        return
    num_turns = inp.num_turns
    k_needed = int(num_turns.max()) if B else 0
    for name in per_turn:
        s = getattr(inp, name)
        if not isinstance(s, Tensor) or s.dim() != 2 or s.shape[0] != B or s.shape[1] < k_needed:
            raise ValueError(
                f"{name} must be a ({B}, K) tensor with K >= the number of turns ({k_needed}), got {_desc(s)}"
            )
        if name == "tool_results" and s.is_floating_point():
            raise ValueError(f"tool_results must be a bool tensor (turn k received a tool result), got {s.dtype}")
    if check_keys:
        keys = inp.turn_obs_keys
        if len(keys) != B:
            raise ValueError(f"turn_obs_keys must have one list per trajectory ({B}), got {len(keys)}")
        n = num_turns.tolist()
        for b, row in enumerate(keys):
            if len(row) < n[b]:
                raise ValueError(f"turn_obs_keys[{b}] has {len(row)} keys but row {b} has {n[b]} turns")


def _check_turn_contract(turn_ids: Tensor, response_mask: Tensor) -> None:
    """``turn_ids >= 0`` exactly on model tokens; the turn order is checked where turns are used (``turn_view``)."""
    bad = (response_mask > 0) != (turn_ids >= 0)
    if bool(bad.any()):
        b, t = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"turn_ids and response_mask disagree at row {b}, position {t} (turn_ids={int(turn_ids[b, t])}, "
            f"response_mask={int(response_mask[b, t])}): turn_ids must be >= 0 exactly on model tokens, -1 elsewhere"
        )


def _desc(x: object) -> str:
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)} ({x.dtype})"
    return repr(type(x).__name__)
