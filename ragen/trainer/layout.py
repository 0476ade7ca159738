"""Training on the two row layouts of a rollout (docs/design.md, the two layouts).

``agent.layout`` names one of :data:`LAYOUTS`, chosen once per run (:func:`layout_of`); the trainers, the config
checks and the run plan ask the chosen :class:`Layout` instead of asking which layout is active. Each layout owns:

* its rows: ``rows``, the agent's half (``ragen.agent.layout``: how episodes become rows, how many there are);
* the worker batch: :meth:`Layout.train_batch` (which rows form one sequence for the ``seq-mean-*`` losses) and
  :meth:`Layout.padded` (turn rows vary in number per step, so they are padded with empty rows to a multiple the
  mini-batches and ranks divide; trajectory rows are as many as the episodes, which the batch checks make divide);
* the estimators' view: :meth:`Layout.advantages` (``phases.advantages`` on trajectory rows; on turn rows each
  episode's model tokens gathered into a compact view and scattered back, ``ragen.trainer.turn_layout``);
* its config checks: :meth:`Layout.checks` (what makes a row differ from what the model saw),
  ``unread_algorithm_keys`` (algorithm keys its rows leave without effect) and :meth:`Layout.turn_rows_problems`
  (for consumers that need one row per turn).

The agent's half sits in the agent layer because the proxy collates; this half needs the workers' ``TrainBatch``
and the trainer's config, which the agent layer may not import.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ragen.agent.batch import RolloutBatch
from ragen.agent.layout import RowLayout, TrajectoryRows, TurnRows
from ragen.trainer import phases, turn_layout
from ragen.trainer.config import TrainConfig
from ragen.trainer.derived import CHARS_PER_TOKEN, trajectory_token_estimate
from ragen.workers.data import TrainBatch

AdvantagesReturns = tuple[torch.Tensor, torch.Tensor]  # (advantages, returns), each (B, T)


class Layout(Protocol):
    """What training on one row layout needs (module docstring)."""

    name: str
    rows: RowLayout
    unread_algorithm_keys: dict[str, str]  # algorithm.<key> -> why no estimator reads it on these rows

    def train_batch(self, batch: RolloutBatch) -> TrainBatch:
        """The worker-side view of ``batch`` (``phases.to_train_batch``) with this layout's ``seq_ids``."""
        ...

    def padded(self, tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
        """``tb`` with empty rows appended where this layout's row count needs it to divide by ``multiple``."""
        ...

    def advantages(self, estimator: str, batch: RolloutBatch, values: torch.Tensor | None,
                   bootstrap_values: torch.Tensor | None = None, token_penalties: torch.Tensor | None = None,
                   **scalars) -> AdvantagesReturns:
        """(advantages, returns) (B, T), 0 off the response; inputs as in ``phases.advantage_inputs``."""
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

    def train_batch(self, batch: RolloutBatch) -> TrainBatch:
        return phases.to_train_batch(batch)  # every row its own sequence

    def padded(self, tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
        return tb  # as many rows as episodes, which the batch checks make divide into mini-batches and ranks

    def advantages(self, estimator: str, batch: RolloutBatch, values: torch.Tensor | None,
                   bootstrap_values: torch.Tensor | None = None, token_penalties: torch.Tensor | None = None,
                   **scalars) -> AdvantagesReturns:
        return phases.advantages(estimator, batch, values, bootstrap_values, token_penalties, **scalars)

    def checks(self, cfg: TrainConfig) -> list[str]:
        ag, out = cfg.agent, []
        if ag.max_new_tokens < ag.max_model_len:  # otherwise the budget itself is refused (checks.check_agent)
            out += _budget_problems(cfg)
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
    unread_algorithm_keys = {
        "skip_env_tokens": "agent.layout=turn computes advantages on each episode's model tokens only (no env tokens)"}

    def train_batch(self, batch: RolloutBatch) -> TrainBatch:
        # a turn row's sequence is its episode; a batch of placeholders only (every episode failed) trains nothing
        # and keeps each row its own sequence
        turns = batch.turn_index is not None and bool((batch.turn_index >= 0).any())
        return phases.to_train_batch(batch, seq_ids=batch.episode_index if turns else None)

    def padded(self, tb: TrainBatch, multiple: int, pad_id: int) -> TrainBatch:
        return turn_layout.pad_rows(tb, multiple, pad_id)  # the row count varies per step

    def advantages(self, estimator: str, batch: RolloutBatch, values: torch.Tensor | None,
                   bootstrap_values: torch.Tensor | None = None, token_penalties: torch.Tensor | None = None,
                   **scalars) -> AdvantagesReturns:
        return turn_layout.turn_layout_advantages(estimator, batch, values, bootstrap_values, token_penalties,
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


def _budget_problems(cfg: TrainConfig) -> list[str]:
    """The last turn's full-history prompt + its response must fit ``agent.max_model_len`` at worst-case response
    lengths: prompt, observation and response tokens together (estimated, ``derived.trajectory_token_estimate``).
    Otherwise history gets cut and the cut trajectory rows are masked out of training."""
    ag, est = cfg.agent, trajectory_token_estimate(cfg)
    if est.total <= ag.max_model_len:
        return []
    return [f"prompt budget: env.max_turn * agent.max_new_tokens = {est.responses} tokens of responses + about "
            f"{est.first_prompt + est.observations} prompt and observation tokens (first prompt ~{est.first_prompt}, "
            f"{cfg.env.max_turn - 1} later user message(s) ~{est.observations}; {CHARS_PER_TOKEN} characters per "
            f"token) = {est.total} > agent.max_model_len={ag.max_model_len}: the last turns could not see the whole "
            "history, and trajectory rows whose history is cut are masked out of training; raise "
            "agent.max_model_len, lower agent.max_new_tokens or env.max_turn, or use agent.layout=turn"]
