"""The trainer's side of the run report (``ragen.report``): what it saves per token, and the validation credit.

* Training: ``trainer.report_train_samples`` episodes of every step's batch (spread evenly over the batch, no RNG)
  go to ``train_samples/step_N.jsonl`` with the advantages, returns, values and old log-probs of the update
  (N = the step number the update is logged under).
* Validation: ``trainer.report_val_samples`` episodes of ``val_rollouts/step_N.jsonl`` (spread evenly; null = all)
  get their token rows, with log-probs under the current actor, the critic's values, and the advantages the
  estimator assigns over the validation batch (the same estimator and scalars as training, without KL penalties;
  critic estimators without a critic, e.g. in ``trainer.val_only``, leave advantages out and the engine's sampling
  log-probs stand in); the others are saved as text. Only the picked episodes' rows go through the actor (and
  critic): the estimator still runs over the whole batch (group statistics use every reward), with zero values on
  the other rows, which no picked row's advantage reads; except under ``algorithm.whiten`` with a critic
  estimator, where whitening would mix those zeros in: the picked episodes are then scored among themselves.

Positions follow ``AdvantageInputs``: ``advantages[:, t]`` / ``log_probs[:, t]`` belong to token t, ``values[:, t]``
is V of the context before token t (``ragen.report.records``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ragen.agent.batch import RolloutBatch, episode_records
from ragen.ppo.truncation import bootstrap_values
from ragen.report.records import Credit, episode_rows, episode_token_records, sample_indices
from ragen.trainer import credit
from ragen.trainer.config.run_shape import estimator_needs_values
from ragen.trainer.layout import layout_of, pad_rows
from ragen.utils.tracking import write_jsonl

if TYPE_CHECKING:
    from ragen.trainer.run import Run
    from ragen.workers.data import TrainBatch


def train_sample_rows(run: Run, batch: RolloutBatch) -> list[int]:
    """The rows of the episodes :func:`save_train_samples` saves (``trainer.report_train_samples``, spread evenly)."""
    groups = episode_rows(batch)
    return sorted(r for i in sample_indices(len(groups), run.cfg.trainer.report_train_samples) for r in groups[i])


def rows_log_probs(run: Run, tb: TrainBatch, rows: list[int], row_multiple: int, n: int) -> torch.Tensor:
    """(n, T) log-probs under the actor's current weights of rows ``rows`` of the worker batch ``tb`` (padded to
    ``row_multiple`` rows for the call), zeros on the other rows: the old log-probs of the saved training samples in
    a step whose update is exactly on-policy (no old-log-prob pass over the whole batch)."""
    sub = pad_rows(tb.select(rows), row_multiple, run.proxy.pad_id)
    log_probs = run.workers["actor"].call("compute_log_probs", sub)[: len(rows)]
    return _scatter_rows(log_probs, rows, n)


def save_train_samples(run: Run, batch: RolloutBatch, credit: Credit, step: int) -> Path:
    """Write ``trainer.report_train_samples`` episodes of the (filtered) training ``batch`` with their ``credit``
    (tensors over the batch's rows) to ``train_samples/step_{step}.jsonl``."""
    picked = sample_indices(len(episode_rows(batch)), run.cfg.trainer.report_train_samples)
    records = episode_token_records(batch, run.tokenizer, credit, episodes=picked)
    return write_jsonl(run.dir / "train_samples" / f"step_{step}.jsonl", records)


def val_credit(run: Run, batch: RolloutBatch, row_multiple: int, rows: list[int] | None = None) -> Credit:
    """Log-probs, values and advantages of a validation batch (module docstring); (B, T) tensors over its rows.
    ``row_multiple``: the rows a worker batch is padded to a multiple of; ``rows``: the rows to run through the
    actor / critic (None = all); the others get zeros (not meaningful)."""
    cfg, layout = run.cfg, layout_of(run.cfg)
    from ragen.trainer.builders import value_worker

    actor, critic = run.workers.get("actor"), value_worker(run.cfg, run.workers)
    values = boot = None
    if actor is None:
        log_probs = batch.sample_log_probs
    else:
        full = layout.train_batch(batch)
        picked = list(range(full.batch_size)) if rows is None else rows
        tb = full.select(picked) if len(picked) < full.batch_size else full
        n = tb.batch_size
        tb = pad_rows(tb, row_multiple, run.proxy.pad_id)
        if critic is actor:  # shared value head: one forward gives both
            log_probs, values, _ = actor.call("compute_log_probs_and_values", tb)
        else:
            log_probs = actor.call("compute_log_probs", tb)
            if critic is not None:
                values, _ = critic.call("compute_values", tb)
        log_probs = _scatter_rows(log_probs[:n], picked, full.batch_size)
        if values is not None:
            values = _scatter_rows(values[:n], picked, full.batch_size)
            boot = bootstrap_values(critic, batch.select(picked), run.proxy.pad_id, row_multiple)
            boot = None if boot is None else _scatter_rows(boot, picked, full.batch_size)
    alg = cfg.algorithm
    if values is None and estimator_needs_values(alg.estimator):
        return Credit(log_probs=log_probs)
    scored = batch if alg.use_step_reward else credit.without_step_rewards(batch)
    adv, ret = layout.advantages(alg.estimator, scored, values, boot, None, **alg.advantage_kwargs())
    return Credit(advantages=adv, returns=ret, values=values, log_probs=log_probs)


def _scatter_rows(x: torch.Tensor, rows: list[int], n: int) -> torch.Tensor:
    """``x`` (len(rows), ...) placed at ``rows`` of a zero tensor with ``n`` rows."""
    if len(rows) == n:
        return x
    out = x.new_zeros((n, *x.shape[1:]))
    out[torch.tensor(rows, dtype=torch.long)] = x
    return out


def val_records(run: Run, batch: RolloutBatch, row_multiple: int) -> list[dict]:
    """One record per validation episode: ``trainer.report_val_samples`` of them (spread evenly) with their token
    rows and :func:`val_credit` (``row_multiple`` as there), the rest as :func:`ragen.agent.batch.episode_records`
    text."""
    groups = episode_rows(batch)
    k = run.cfg.trainer.report_val_samples
    picked = list(range(len(groups))) if k is None else sample_indices(len(groups), k)
    records = episode_records(batch)
    if len(records) != len(groups):  # episodes not aligned with rows: every episode with its rows, as before
        return episode_token_records(batch, run.tokenizer, val_credit(run, batch, row_multiple))
    if not picked:
        return records
    rows = [r for e in picked for r in groups[e]]
    alg = run.cfg.algorithm
    if alg.whiten and estimator_needs_values(alg.estimator) and len(rows) < batch.batch_size:
        sub = batch.select(rows)  # whitening mixes rows: the picked episodes are scored among themselves
        tokens = episode_token_records(sub, run.tokenizer, val_credit(run, sub, row_multiple))
    else:
        tokens = episode_token_records(batch, run.tokenizer, val_credit(run, batch, row_multiple, rows=rows),
                                       episodes=picked)
    for e, rec in zip(picked, tokens, strict=True):
        records[e] = rec
    return records
