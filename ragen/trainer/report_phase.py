"""The trainer's side of the run report (``ragen.report``): what it saves per token, and the validation credit.

* Training: ``trainer.report_train_samples`` episodes of every step's batch (spread evenly over the batch, no RNG)
  go to ``train_samples/step_N.jsonl`` with the advantages, returns, values and old log-probs of the update
  (N = the step number the update is logged under).
* Validation: every episode of ``val_rollouts/step_N.jsonl`` gets its token rows, with log-probs under the current
  actor, the critic's values, and the advantages the estimator assigns over the validation batch (the same
  estimator and scalars as training, without KL penalties; critic estimators without a critic, e.g. in
  ``trainer.val_only``, leave advantages out and the engine's sampling log-probs stand in).

Positions follow ``AdvantageInputs``: ``advantages[:, t]`` / ``log_probs[:, t]`` belong to token t, ``values[:, t]``
is V of the context before token t (``ragen.report.records``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragen.agent.batch import RolloutBatch
from ragen.report.records import Credit, episode_rows, episode_token_records, sample_indices
from ragen.trainer import phases, turn_layout
from ragen.trainer.derived import estimator_needs_values


def save_train_samples(trainer: Any, batch: RolloutBatch, credit: Credit, step: int) -> Path:
    """Write ``trainer.report_train_samples`` episodes of the (filtered) training ``batch`` with their ``credit``
    (tensors over the batch's rows) to ``train_samples/step_{step}.jsonl``."""
    picked = sample_indices(len(episode_rows(batch)), trainer.cfg.trainer.report_train_samples)
    records = episode_token_records(batch, trainer.tokenizer, credit, episodes=picked)
    return phases.write_jsonl(trainer.run_dir / "train_samples" / f"step_{step}.jsonl", records)


def val_credit(trainer: Any, batch: RolloutBatch) -> Credit:
    """Log-probs, values and advantages of a validation batch (module docstring); (B, T) tensors over its rows."""
    cfg = trainer.cfg
    from ragen.trainer.builders import value_worker

    actor, critic = trainer.workers.get("actor"), value_worker(trainer.cfg, trainer.workers)
    values = last = None
    if actor is None:
        log_probs = batch.sample_log_probs
    else:
        tb = phases.to_train_batch(batch)
        n = tb.batch_size
        tb = turn_layout.pad_rows(tb, trainer._row_multiple(), trainer.proxy.pad_id)
        if critic is actor:  # shared value head: one forward gives both
            log_probs, values, last = actor.call("compute_log_probs_and_values", tb)
        else:
            log_probs = actor.call("compute_log_probs", tb)
            if critic is not None:
                values, last = critic.call("compute_values", tb)
        log_probs = log_probs[:n]
        if values is not None:
            values, last = values[:n], last[:n]
    alg = cfg.algorithm
    if values is None and estimator_needs_values(alg.estimator):
        return Credit(log_probs=log_probs)
    estimate = turn_layout.turn_layout_advantages if cfg.agent.layout == "turn" else phases.advantages
    scored = batch if alg.use_step_reward else phases.without_step_rewards(batch)
    adv, ret = estimate(alg.estimator, scored, values, last, None, **alg.advantage_kwargs())
    return Credit(advantages=adv, returns=ret, values=values, log_probs=log_probs)


def val_records(trainer: Any, batch: RolloutBatch) -> list[dict]:
    """Every validation episode with its token rows and :func:`val_credit` (one record per episode)."""
    return episode_token_records(batch, trainer.tokenizer, val_credit(trainer, batch))
