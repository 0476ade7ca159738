"""What every advantage estimator reads: :class:`AdvantageInputs` and its validation.

Layout (DESIGN.md, "The data that flows")::

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
      token_rewards: float. The reward of turn k sits on the last model token of turn k (a KL penalty may add
        per-token terms on model tokens). Rewards outside ``response_mask`` are ignored.
      response_mask: 1 on model-generated tokens, 0 on prompt, env observation and pad tokens.
      turn_ids: long. k on the model tokens of turn k (0-based, contiguous 0..n-1 per row), -1 elsewhere.
      values: float critic values, or None (required by the GAE family). Only values on model tokens are
        read, plus, for truncated rows, the value at the last non-pad position (the bootstrap).
      attention_mask: optional, 1 on real (non-pad) tokens. Only used to find the bootstrap position of
        truncated rows; without it the last model token stands in for the last non-pad token.
    Per trajectory:
      group_ids: (B,) long, trajectories sharing an env seed (group-relative estimators).
      truncated: (B,) bool, the episode hit max_turn without finishing: bootstrap instead of 0.
      step_rewards: (B, K) float step reward R^T of each turn (ms_grpo / ms_po), 0 past the last turn.
      outcome_rewards: (B,) float outcome reward R^O (ms_grpo / ms_po).
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
    turn_obs_keys: list[list[str]] | None = None
    attention_mask: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.token_rewards.shape[0])

    @property
    def num_turns(self) -> Tensor:
        """(B,) long: number of turns of each row (max turn id + 1, 0 for a row without model tokens)."""
        return self.turn_ids.amax(dim=1).clamp(min=-1) + 1

    def validate(self, needs: tuple[str, ...] = (), *, check_turn_contract: bool = True) -> None:
        """Check shapes, dtypes and the turn-id contract; ``needs`` names optional fields that must be set (and,
        for ``step_rewards`` / ``turn_obs_keys``, be long enough for every row's turns).

        ``check_turn_contract=False`` skips the (B, T) turn-id check, for callers whose estimator checks it in
        the same pass that reads the turns (the fused GAE kernel). Raises ValueError naming the bad field and
        what it should be.
        """
        _check_token_tensors(self)
        for name in needs:
            if getattr(self, name) is None:
                raise ValueError(
                    f"AdvantageInputs.{name} is None but this estimator needs it; "
                    f"set it (see AdvantageInputs docstring) or choose another estimator"
                )
        _check_row_tensors(self, needs)
        if check_turn_contract:
            _check_turn_contract(self.turn_ids, self.response_mask)

    def bootstrap_values(self) -> Tensor:
        """(B,) value to bootstrap from after the last step: V(last non-pad position) if truncated, else 0."""
        return bootstrap_values(self.values, self.truncated, self.response_mask, self.attention_mask)


def bootstrap_values(
    values: Tensor | None, truncated: Tensor | None, response_mask: Tensor, attention_mask: Tensor | None = None
) -> Tensor:
    """(B,) bootstrap values for truncated rows, 0 for rows that ended (or when ``values`` is None).

    values: (B, T); truncated: (B,) bool; the bootstrap position is the last position where ``attention_mask``
    (else ``response_mask``) is nonzero.
    """
    B, T = response_mask.shape
    dtype = torch.float32 if values is None else torch.promote_types(values.dtype, torch.float32)
    out = torch.zeros(B, dtype=dtype, device=response_mask.device)
    if values is None or truncated is None or T == 0:
        return out
    rows = truncated.bool().nonzero()[:, 0]  # only truncated rows bootstrap: look at those rows only
    if rows.numel():
        real = (attention_mask if attention_mask is not None else response_mask).index_select(0, rows) > 0
        # 1 + the last real position (0: none) as the max of mask bytes times 1-based int16 positions: a byte
        # multiply and an int16 max, several times faster on CPU than where/argmax over the rows
        pos = torch.arange(1, T + 1, device=real.device, dtype=torch.int16 if T < 32767 else torch.int32)
        last = (real.view(torch.uint8) * pos).amax(dim=1).long() - 1
        boot = values[rows, last.clamp(min=0)].to(dtype)  # only the n bootstrap entries are read
        out[rows] = torch.where(last >= 0, boot, torch.zeros_like(boot))
    return out


def _check_token_tensors(inp: AdvantageInputs) -> None:
    r = inp.token_rewards
    if not isinstance(r, Tensor) or r.dim() != 2:
        raise ValueError(f"token_rewards must be a (B, T) tensor, got {_desc(r)}")
    for name in ("response_mask", "turn_ids", "values", "attention_mask"):
        t = getattr(inp, name)
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != tuple(r.shape)):
            raise ValueError(f"{name} must have the shape of token_rewards {tuple(r.shape)}, got {_desc(t)}")
    if inp.turn_ids.is_floating_point():
        raise ValueError(f"turn_ids must be an integer tensor (k on turn k, -1 elsewhere), got {inp.turn_ids.dtype}")


def _check_row_tensors(inp: AdvantageInputs, needs: tuple[str, ...]) -> None:
    """Shapes of the per-trajectory fields; per-turn fields are checked against the turn count (a (B, T)
    reduction) only when the estimator ``needs`` them: an estimator that ignores them cannot misuse them."""
    B = inp.batch_size
    for name in ("group_ids", "truncated", "outcome_rewards"):
        t = getattr(inp, name)
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != (B,)):
            raise ValueError(f"{name} must be a ({B},) tensor (one entry per trajectory), got {_desc(t)}")
    check_steps = inp.step_rewards is not None and "step_rewards" in needs
    check_keys = inp.turn_obs_keys is not None and "turn_obs_keys" in needs
    if not (check_steps or check_keys):
        return
    num_turns = inp.num_turns
    k_needed = int(num_turns.max()) if B else 0
    if check_steps:
        s = inp.step_rewards
        if not isinstance(s, Tensor) or s.dim() != 2 or s.shape[0] != B or s.shape[1] < k_needed:
            raise ValueError(
                f"step_rewards must be a ({B}, K) tensor with K >= the number of turns ({k_needed}), got {_desc(s)}"
            )
    if check_keys:
        keys = inp.turn_obs_keys
        if len(keys) != B:
            raise ValueError(f"turn_obs_keys must have one list per trajectory ({B}), got {len(keys)}")
        n = num_turns.tolist()
        for b, row in enumerate(keys):
            if len(row) < n[b]:
                raise ValueError(f"turn_obs_keys[{b}] has {len(row)} keys but row {b} has {n[b]} turns")


def _check_turn_contract(turn_ids: Tensor, response_mask: Tensor) -> None:
    model = response_mask if response_mask.dtype == torch.bool else response_mask > 0
    if _same_bools(model, turn_ids >= 0):  # details only on failure
        return
    bad = model != (turn_ids >= 0)
    if bool(bad.any()):
        b, t = (int(i) for i in bad.nonzero()[0])
        raise contract_error(turn_ids, response_mask, b, t)
    # Turn order and contiguity are checked where turns are used (ragen.algorithms.scan.turn_view).


def contract_error(turn_ids: Tensor, response_mask: Tensor, b: int, t: int) -> ValueError:
    """The error for a position (b, t) where ``turn_ids >= 0`` and ``response_mask`` disagree."""
    return ValueError(
        f"turn_ids and response_mask disagree at row {b}, position {t} (turn_ids={int(turn_ids[b, t])}, "
        f"response_mask={int(response_mask[b, t])}): turn_ids must be >= 0 exactly on model tokens, -1 elsewhere"
    )


def _same_bools(a: Tensor, b: Tensor) -> bool:
    """torch.equal for two bool tensors, compared 8 bytes at a time when the sizes allow (several times faster)."""
    a, b = a.contiguous().view(-1), b.contiguous().view(-1)
    if a.numel() % 8 == 0 and a.numel() == b.numel() and a.storage_offset() % 8 == 0 == b.storage_offset() % 8:
        return torch.equal(a.view(torch.int64), b.view(torch.int64))
    return torch.equal(a, b)


def _desc(x: object) -> str:
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)} ({x.dtype})"
    return repr(type(x).__name__)
