"""Training on the two row layouts of a rollout (docs/design.md, the two layouts).

``agent.layout`` names one of :data:`LAYOUTS`, chosen once per run (:func:`layout_of`); the trainers, the config
checks and the run plan ask the chosen :class:`Layout` instead of asking which layout is active. Each layout owns:

* its rows: ``rows``, the agent's half (``ragen.agent.layout``: how episodes become rows, how many there are);
* the worker batch: :meth:`Layout.train_batch` (which rows form one sequence for the ``seq-mean-*`` losses) and
  :meth:`Layout.padded` (turn rows vary in number per step, so they are padded with empty rows to a multiple the
  mini-batches and ranks divide; trajectory rows are as many as the episodes, which the batch checks make divide);
* the estimators' view: :meth:`Layout.advantages` (``credit.advantages`` on trajectory rows; on turn rows each
  episode's model tokens gathered into a compact view and scattered back, ``ragen.trainer.layout``);
* its config checks: :meth:`Layout.checks` (what makes a row differ from what the model saw),
  ``unread_algorithm_keys`` (algorithm keys its rows leave without effect) and :meth:`Layout.turn_rows_problems`
  (for consumers that need one row per turn).

The agent's half sits in the agent layer because the proxy collates; this half needs the workers' ``TrainBatch``
and the trainer's config, which the agent layer may not import.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch

from ragen.agent.batch import RolloutBatch
from ragen.agent.layout import RowLayout, TrajectoryRows, TurnRows
from ragen.algorithms import AdvantageInputs, compute_advantage
from ragen.trainer import credit
from ragen.workers.data import TrainBatch

if TYPE_CHECKING:
    from ragen.trainer.config.schema import TrainConfig

AdvantagesReturns = tuple[torch.Tensor, torch.Tensor]  # (advantages, returns), each (B, T)


class Layout(Protocol):
    """What training on one row layout needs (module docstring)."""

    name: str
    rows: RowLayout
    unread_algorithm_keys: dict[str, str]  # algorithm.<key> -> why no estimator reads it on these rows
    holds_whole_history: bool  # a row holds every turn: the last turn's full-history prompt must fit the budget

    def train_batch(self, batch: RolloutBatch) -> TrainBatch:
        """The worker-side view of ``batch`` (``credit.to_train_batch``) with this layout's ``seq_ids``."""
        ...

    def padded(self, tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
        """``tb`` with empty rows appended where this layout's row count needs it to divide by ``multiple``."""
        ...

    def advantages(self, estimator: str, batch: RolloutBatch, values: torch.Tensor | None,
                   bootstrap_values: torch.Tensor | None = None, token_penalties: torch.Tensor | None = None,
                   **scalars) -> AdvantagesReturns:
        """(advantages, returns) (B, T), 0 off the response; inputs as in ``credit.advantage_inputs``."""
        ...

    def checks(self, cfg: TrainConfig) -> list[str]:
        """Problems of ``cfg`` under this layout, each naming its key and the fix."""
        ...

    def turn_rows_problems(self, why: str) -> list[str]:
        """For a consumer that needs one row per turn (``why`` says what it does with them): what this layout
        lacks, as problems."""
        ...

    def rows_text(self, episodes: int, max_turns: int) -> str:
        """The rows of a step of ``episodes`` episodes, for the run plan."""
        ...

    def at_most(self, n: int) -> str:
        """``n`` as the plan states a count that follows the rows: exact, or a bound."""
        ...


class TrajectoryLayout:
    """One row per episode."""

    name = "trajectory"
    rows = TrajectoryRows()
    unread_algorithm_keys: dict[str, str] = {}
    holds_whole_history = True

    def train_batch(self, batch: RolloutBatch) -> TrainBatch:
        return credit.to_train_batch(batch)  # every row its own sequence

    def padded(self, tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
        return tb  # as many rows as episodes, which the batch checks make divide into mini-batches and ranks

    def advantages(self, estimator: str, batch: RolloutBatch, values: torch.Tensor | None,
                   bootstrap_values: torch.Tensor | None = None, token_penalties: torch.Tensor | None = None,
                   **scalars) -> AdvantagesReturns:
        return credit.advantages(estimator, batch, values, bootstrap_values, token_penalties, **scalars)

    def checks(self, cfg: TrainConfig) -> list[str]:
        ag, out = cfg.agent, []
        window = ag.max_context_window
        if window is not None and window < cfg.env.max_turn:
            out.append(f"agent.max_context_window={window} < env.max_turn={cfg.env.max_turn} cuts history, so one "
                       "trajectory row would not be what the model saw at every turn; use agent.layout=turn (or "
                       "max_context_window=null)")
        if ag.history_thinking not in self.rows.history_thinking:
            out.append(f"agent.history_thinking={ag.history_thinking!r} needs agent.layout=turn (got {ag.layout!r}): "
                       "a trajectory row holds every turn's thinking, which later prompts leave out, so it is not "
                       "what the model saw; set agent.layout=turn")
        return out

    def turn_rows_problems(self, why: str) -> list[str]:
        return [f"agent.layout={self.name!r}: {why}; set agent.layout=turn"]

    def rows_text(self, episodes: int, max_turns: int) -> str:
        return f"{self.rows.max_rows(episodes, max_turns)} rows (trajectory layout: one per episode)"

    def at_most(self, n: int) -> str:
        return str(n)


class TurnLayout:
    """One row per generated turn."""

    name = "turn"
    rows = TurnRows()
    holds_whole_history = False  # each row is one turn's exact prompt, however history was cut for it
    unread_algorithm_keys = {
        "skip_env_tokens": "agent.layout=turn computes advantages on each episode's model tokens only (no env tokens)"}

    def train_batch(self, batch: RolloutBatch) -> TrainBatch:
        # a turn row's sequence is its episode; a batch of placeholders only (every episode failed) trains nothing
        # and keeps each row its own sequence
        turns = batch.turn_index is not None and bool((batch.turn_index >= 0).any())
        return credit.to_train_batch(batch, seq_ids=batch.episode_index if turns else None)

    def padded(self, tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
        return pad_rows(tb, multiple, pad_id)  # the row count varies per step

    def advantages(self, estimator: str, batch: RolloutBatch, values: torch.Tensor | None,
                   bootstrap_values: torch.Tensor | None = None, token_penalties: torch.Tensor | None = None,
                   **scalars) -> AdvantagesReturns:
        return turn_layout_advantages(estimator, batch, values, bootstrap_values, token_penalties,
                                                  **scalars)

    def checks(self, cfg: TrainConfig) -> list[str]:
        return []  # every row is the exact prompt the model saw, whatever cuts its history

    def turn_rows_problems(self, why: str) -> list[str]:
        return []

    def rows_text(self, episodes: int, max_turns: int) -> str:
        return f"up to {self.rows.max_rows(episodes, max_turns)} rows (turn layout: one per turn)"

    def at_most(self, n: int) -> str:
        return f"up to {n}"


LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (TrajectoryLayout(), TurnLayout())}


def layout_of(cfg: TrainConfig) -> Layout:
    """The layout ``agent.layout`` of ``cfg`` names (the schema and ``AgentConfig`` refuse other names)."""
    return LAYOUTS[cfg.agent.layout]


# The turn layout's training rows (docs/design.md, the two layouts): estimators need each episode's model tokens in
# order, so advantages are computed on a per-episode compact view and scattered back to the turn rows; the row
# count varies per step, so the worker batch is padded with empty rows to a size the mini-batches and ranks divide.


def _positions(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Flat index of every model token: (row, col) in the batch and (episode slot, position) in the compact view,
    plus the first row of each episode."""
    ep, tk = batch.episode_index.tolist(), batch.turn_index.tolist()
    episodes = sorted(set(ep))
    slot = {e: i for i, e in enumerate(episodes)}
    rows, cols, eps, pos = [], [], [], []
    filled = [0] * len(episodes)
    first = [-1] * len(episodes)
    for r in sorted(range(batch.batch_size), key=lambda r: (ep[r], tk[r])):
        s = slot[ep[r]]
        if first[s] < 0:
            first[s] = r
        c = torch.nonzero(batch.response_mask[r]).flatten()
        rows.append(torch.full_like(c, r))
        cols.append(c)
        eps.append(torch.full_like(c, s))
        pos.append(torch.arange(filled[s], filled[s] + len(c)))
        filled[s] += len(c)
    cat = [torch.cat(x) if x else torch.zeros(0, dtype=torch.long) for x in (rows, cols, eps, pos)]
    return cat[0], cat[1], cat[2], cat[3], first


def turn_layout_advantages(
    estimator: str, batch: RolloutBatch, values: torch.Tensor | None, bootstrap_values: torch.Tensor | None = None,
    token_penalties: torch.Tensor | None = None, **scalars,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``compute_advantage`` for a turn-layout batch: (advantages, returns), (B, T), 0 off the response.

    ``values`` / ``token_penalties``: (B, T) over the turn rows, ``values`` in ``ValueModel``'s convention
    (V of the context before token t) computed inside each turn sample, so the gather below never mixes turns.
    Each episode's model tokens, in turn order, form one row of the compact view (no env tokens in it);
    per-episode fields come from the episode's first row. ``bootstrap_values`` (B,): per row, V of its episode's
    bootstrap prompt (``ragen.ppo.truncation``; read for truncated episodes only), the same state and value the
    trajectory layout bootstraps from.
    """
    rows, cols, eps, pos, first = _positions(batch)
    n_ep, width = len(first), max(1, int(pos.max()) + 1 if len(pos) else 1)

    def gather(x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = torch.full((n_ep, width), fill, dtype=x.dtype)
        out[eps, pos] = x[rows, cols]
        return out

    mask = torch.zeros(n_ep, width, dtype=torch.long)
    mask[eps, pos] = 1
    idx = torch.tensor(first)
    pick = (lambda t: None if t is None else t[idx])  # noqa: E731
    inputs = AdvantageInputs(
        token_rewards=gather(batch.token_rewards.float()), response_mask=mask, turn_ids=gather(batch.turn_ids, -1),
        values=None if values is None else gather(values.float()), group_ids=pick(batch.group_ids),
        truncated=pick(batch.truncated), step_rewards=pick(batch.step_rewards),
        outcome_rewards=pick(batch.outcome_rewards), tool_results=pick(batch.tool_results), attention_mask=mask,
        turn_obs_keys=None if batch.turn_obs_keys is None else [batch.turn_obs_keys[i] for i in first],
        bootstrap_values=None if bootstrap_values is None else bootstrap_values.float()[idx],
        token_penalties=None if token_penalties is None else gather(token_penalties.float()),
        failed=pick(batch.failed),
    )
    adv_c, ret_c = compute_advantage(estimator, inputs, **scalars)
    adv = torch.zeros(batch.input_ids.shape, dtype=adv_c.dtype)
    ret = torch.zeros(batch.input_ids.shape, dtype=ret_c.dtype)
    adv[rows, cols] = adv_c[eps, pos]
    ret[rows, cols] = ret_c[eps, pos]
    return adv, ret


def pad_rows(tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
    """Append empty rows (one attended pad token, no response) so B is a multiple of ``multiple``."""
    b = tb.batch_size
    extra = (-b) % multiple
    if extra == 0:
        return tb
    t = tb.seq_len
    ids = torch.full((extra, t), pad_id, dtype=tb.input_ids.dtype)
    attn = torch.zeros(extra, t, dtype=tb.attention_mask.dtype)
    attn[:, 0] = 1
    fields = {}
    for name, x in tb.tensors().items():
        fill = {"input_ids": ids, "attention_mask": attn}.get(name, torch.zeros((extra, *x.shape[1:]), dtype=x.dtype))
        if name == "seq_ids":  # a sequence of its own for every padding row
            fill = torch.arange(extra, dtype=x.dtype) + (int(x.max()) + 1 if x.numel() else 0)
        fields[name] = torch.cat([x, fill])
    return TrainBatch(**fields)


def row_multiple(*sizes: int) -> int:
    """The least common multiple of the mini-batch sizes and world sizes the padded batch must divide."""
    out = 1
    for s in sizes:
        out = out * s // math.gcd(out, s)
    return out
