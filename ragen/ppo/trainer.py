"""The PPO-family driver: one readable loop of named, timed phases (docs/design.md, one PPO step).

Per step::

    rollout (agent proxy over the engine) -> engine sleep -> reload -> collapse metrics (every
    ``trainer.collapse_every`` steps, ``ragen.trainer.collapse``) -> rollout filtering (a batch it leaves empty skips
    the update) -> old / ref log-probs
    (and the rollout-correction weights of the engine / trainer gap, ``algorithm.rollout_correction``; no old
    log-prob pass where the actor's update is exactly on-policy, ``credit.old_log_probs_reader``) -> values
    -> bootstrap values (episodes cut by the length budget) -> advantages (ragen.algorithms) -> critic update
    -> actor update -> offload -> engine wake (weights) -> weight sync -> offload -> engine wake (KV cache)
    -> metrics, validation, checkpoint, run report (``ragen.report``, refreshed after each validation)

``reload`` / ``offload`` run with ``trainer.offload=phase`` (``ragen.trainer.step_memory``): the training state
waits in host memory while the engine is awake. Each phase's memory peak is logged as ``memory/<phase>/...``.

Models live in worker groups (Ray placement groups, or in-process), and so do the rollout engines: each actor rank
hosts one (``ragen.trainer.placement``; a vLLM engine on GPUs of its own is the exception), built before its model,
and loads its weights from its own shards. The driver only moves prompts, samples, batches and metrics. The config
is frozen; everything that changes during training (step, RNG, seed counters) is trainer state, saved with every
checkpoint. A dead worker (or engine) stops the run naming it and the phase, or, with ``trainer.max_restarts``, the
worker groups and the engines are rebuilt from the last checkpoint (``ragen.ppo.restarts``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ragen.agent.batch import episode_records, failed_episode_records
from ragen.ppo import report
from ragen.ppo.async_rollout import RolloutQueue
from ragen.ppo.restarts import InitialState, rebuild_workers, rewind
from ragen.ppo.truncation import bootstrap_values
from ragen.report import Credit, build_report, pending_steps
from ragen.rollout.versioned import VersionedEngine
from ragen.trainer import builders, credit, layout, numerics, placement, step_memory
from ragen.trainer.collapse import collapse_due, collapse_step_metrics
from ragen.trainer.config.run_shape import engine_gpus, uses_kl, world_size
from ragen.trainer.config.schema import TrainConfig
from ragen.trainer.hosted import HostedEngines
from ragen.trainer.layout import layout_of
from ragen.trainer.metrics import batch_metrics, logprob_gap_metrics, perf_metrics
from ragen.trainer.run import Run
from ragen.trainer.state import rng_preserved
from ragen.trainer.warm_start import run_warm_start
from ragen.utils import console
from ragen.utils.checkpoint import checkpoint_step, latest_checkpoint
from ragen.utils.hardware import resolve_dtype
from ragen.utils.memory import PHASE_MEMORY
from ragen.utils.timing import timed
from ragen.utils.tracking import bar_postfix, write_jsonl
from ragen.workers.group import WorkerFailure


class PPOTrainer:
    """Trains (``fit``) or evaluates (``evaluate``) the policy described by a frozen :class:`TrainConfig`. What the
    run has (workers, engine, proxies, loggers, step, checkpoints) is its :class:`ragen.trainer.run.Run`,
    ``self.run``; the trainer holds the loop and what only it needs."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.run = Run(cfg)
        self.layout = layout_of(cfg)  # rows, worker batches and advantages of agent.layout (ragen.trainer.layout)
        self.skips = numerics.SkipGuard(cfg.trainer.max_consecutive_skips)
        self.failed_steps = numerics.FailedEpisodesGuard(cfg.trainer.max_failed_steps)
        self._report_seconds: float | None = None  # the last report's time, logged with the next step
        self.nccl = False  # set in setup: a separately placed vLLM engine gets its weights over NCCL
        self.engine_spec: Any = None  # the engine each actor rank hosts (None: the engine lives elsewhere)
        self.phase = "setup"  # the running phase, named when a worker fails
        self._updating = False  # a step (or the warm start) has begun changing the weights: no checkpoint until done
        self.restarts = 0  # worker groups rebuilt after a worker died (trainer.max_restarts, ragen.ppo.restarts)
        self.placement_group: Any = None
        self.initial_state: InitialState | None = None  # where a restart before the first checkpoint goes back to
        self.resumed_from: Path | None = None
        self.queue: RolloutQueue | None = None  # trainer.async_rollout: the batches played while the trainer updates
        self._consumed_proxy: dict[str, int] | None = None  # the train proxy's seed counters after the consumed batch

    # ------------------------------------------------------------------ set-up / tear-down
    def setup(self, *, with_workers: bool = True) -> None:
        """Seed, load the model folder, start Ray, the engines and the workers, the proxies, resume; then the engines
        hold the actor's weights and are awake.

        Engines come first (``placement.engine_placement``): each actor rank builds its own and puts it to sleep
        before its model (``builders.build_workers``), and a separately placed vLLM engine starts before any worker.
        Without workers (``trainer.val_only``) the one engine lives in this process."""
        cfg = self.cfg
        run = self.run
        run.prepare()  # model folder (a bad model path fails before any write), run folder, seeds
        if with_workers:
            self._start_engines_and_workers()
        else:  # no workers: the one engine lives in this process
            run.engine = builders.build_engine(cfg, run.model_path, run.tokenizer)
        if cfg.trainer.async_rollout and with_workers:  # every sampled token says which policy version sampled it
            run.engine = VersionedEngine(run.engine)
        run.announce()  # the start-up block
        run.record_placement()  # where each Ray worker runs
        run.proxy, run.val_proxy = builders.build_proxies(cfg, run.engine, run.tokenizer)
        self.initial_state = InitialState.now(run.proxy)
        self.resumed_from = run.open(lambda path: self.load_checkpoint(path, with_workers=with_workers))
        if with_workers and self.resumed_from is None:  # the first load (a resume has loaded the checkpoint's)
            self.sync_engine_weights()

    def _start_engines_and_workers(self) -> None:
        """Ray and the shared GPU placement group, then the engines before any model: the actor's ranks, each
        building its own engine (``engine_spec``) and putting it to sleep before its model, ahead of the other roles'
        groups; or a vLLM engine on GPUs of its own, started before every group and joined to the actor's rank 0
        by an NCCL group."""
        cfg = self.cfg
        builders.start_ray(cfg)
        pg = placement.shared_placement_group(cfg)  # GPUs: one bundle per GPU, rank r of every role in r
        self.placement_group = pg
        self.engine_spec = builders.hosted_engine_spec(cfg, self.run.model_path, self.run.tokenizer)
        if self.engine_spec is None:
            self.run.engine = builders.build_engine(cfg, self.run.model_path, self.run.tokenizer, pg)
        self.run.workers = builders.build_workers(cfg, self.run.model_path, pg, engine=self.engine_spec)
        if self.engine_spec is not None:
            self.run.engine = HostedEngines(self.run.workers["actor"])
        self.nccl = pg is not None and engine_gpus(cfg) > 0
        if self.nccl:
            placement.init_nccl_sync(cfg, self.run.engine, self.run.workers["actor"])

    def shutdown(self) -> None:
        """Stop the rollout thread (asynchronous training), the run's worker groups and its loggers (safe to call
        twice, or after a failed set-up)."""
        self._stop_queue()
        self.run.shutdown()

    def _stop_queue(self) -> None:
        """Stop the asynchronous rollouts; the batches they queued are discarded (replayed after a resume)."""
        if self.queue is not None:
            discarded = self.queue.stop()
            self.queue = None
            if discarded:
                console.say(f"[ragen] discarded {discarded} queued rollout batch(es); a resume replays their "
                            "episodes from the checkpoint's seeds")

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train until ``trainer.total_steps``; returns the last step's metrics (with the final validation). A stop by
        signal (``Interrupted``: Ctrl-C, a scheduler's SIGTERM) leaves with a checkpoint where one can be written
        (:meth:`_interrupted`)."""
        try:
            return self._fit()
        except console.Interrupted as exc:
            raise self._interrupted(exc) from None

    def _interrupted(self, exc: console.Interrupted) -> console.Interrupted:
        """``exc`` with where the run stands: a checkpoint of the complete steps is written when none is current
        and the interrupted step had not begun changing the weights (else the last complete one stands)."""
        run = self.run
        last = latest_checkpoint(run.ckpt_root)
        last_step = -1 if last is None else checkpoint_step(last)
        if self._updating:
            saved = (f"no checkpoint written: step {run.step + 1} had begun changing the weights; the last "
                     f"complete one is {last or '(none)'}")
        elif run.step > max(last_step, 0):
            try:
                saved = f"saved checkpoint {run.write_checkpoint()}"
            except Exception as err:  # noqa: BLE001 - a failed save must not hide the interruption
                saved = f"could not save a checkpoint ({type(err).__name__}: {err}); the last complete one is {last}"
        else:
            saved = f"the last checkpoint, {last or '(none)'}, is current"
        return exc.with_message(f"{exc} in phase {self.phase!r} of step {run.step + 1} after {run.step} complete "
                                f"step(s); {saved}; run the same command again to resume (trainer.resume=auto)")

    def _fit(self) -> dict[str, float]:
        tr = self.cfg.trainer
        last: dict[str, float] = {}
        if tr.val_before_train and self.run.step == 0 and not self.run.warm_started:
            last = self._guarded(self.validate, step=0)
            self.run.log(last, 0)
            self.write_report()
        if tr.sft_warmup_steps > 0 and self.run.step == 0 and not self.run.warm_started:
            self._updating = True
            last = self._guarded(self.warm_start, phase="warm_start", step=0)
            self.run.warm_started, self._updating = True, False
            self.write_report()
            self.save_checkpoint()  # a crash in RL resumes after the warm start
        if self.run.step >= tr.total_steps and not (tr.total_steps == 0 and self.run.warm_started):
            console.say(f"[ragen] {self.run.dir} is already at step {self.run.step} >= trainer.total_steps="
                       f"{tr.total_steps}; nothing to train (trainer.resume=none or a new trainer.output_dir "
                       "starts afresh)")
        bar = tqdm(total=tr.total_steps, initial=self.run.step, desc="train", unit="step", file=console.err_stream(),
                   disable=not tr.progress_bar, dynamic_ncols=True)
        while self.run.step < tr.total_steps:
            try:
                last = self._advance()
            except WorkerFailure as exc:  # a dead worker: stop (named), or rebuild from the last checkpoint
                if self.restarts >= tr.max_restarts:
                    raise
                self.restart(exc)
                bar.reset(total=tr.total_steps)
                bar.update(self.run.step)
                continue
            bar.update(1)
            bar.set_postfix(bar_postfix(last), refresh=False)
        bar.close()
        self.run.plot()
        return last

    def warm_start(self) -> dict[str, float]:
        """``trainer.sft_warmup_steps`` steps of behaviour cloning on the envs' experts through the train proxy
        (``ragen.trainer.warm_start``); returns the validation after it."""
        return run_warm_start(self.run, proxy=self.run.proxy, row_multiple=self.row_multiple(),
                              sync_engine=self.sync_engine_weights, validate=self.validate)

    def restart(self, failure: Exception) -> None:
        """After a dead worker or engine (``failure``), with ``trainer.max_restarts`` left: rebuild every worker group
        (and a separately placed engine) and continue from the last complete checkpoint (``ragen.ppo.restarts``);
        counted in ``restarts``. Asynchronous training: the rollout thread is stopped and its queue discarded first,
        and the engine's version restarts at the checkpoint's step."""
        cfg = self.cfg
        self.restarts += 1
        self._stop_queue()
        what = "worker groups and the rollout engine" if self.nccl else "worker groups"
        console.say(f"[ragen] {failure}\n[ragen] restart {self.restarts}/{cfg.trainer.max_restarts}: rebuilding the "
                    f"{what}")
        rebuild_workers(self.run, self.placement_group, self.engine_spec, nccl=self.nccl)
        rewind(self.run, self.initial_state, self.load_checkpoint, self.sync_engine_weights)
        if isinstance(self.run.engine, VersionedEngine):
            self.run.engine.reset_version(self.run.step)
        self.skips = numerics.SkipGuard(cfg.trainer.max_consecutive_skips)
        self.failed_steps = numerics.FailedEpisodesGuard(cfg.trainer.max_failed_steps)
        self._updating = False

    def _advance(self) -> dict[str, float]:
        """One step of ``fit``: train, log (with validation when due), checkpoint when due; returns its metrics."""
        tr = self.cfg.trainer
        metrics = self._guarded(self.train_step)
        metrics.update(self._guarded(self.run.memory_metrics, phase="memory_stats"))
        metrics["trainer/restarts"] = float(self.restarts)
        self.run.complete_step()
        if self._consumed_proxy is not None:  # asynchronous: the proxy has played ahead of the consumed batch
            self.run.proxy_after_step, self._consumed_proxy = self._consumed_proxy, None
        self._updating = False
        validating = self.run.due(tr.val_freq)
        if validating:
            metrics.update(self._guarded(self.validate, step=self.run.step))
        self.run.log(metrics, self.run.step)
        if validating:
            self.write_report()
        if self.run.due(tr.save_freq):
            self._guarded(self.save_checkpoint)
        if self.queue is not None:  # the step is over: admit the batches it holds back (trainer.max_staleness)
            self.queue.release(self.run.step)
        return metrics

    def train_step(self) -> dict[str, float]:
        """One PPO step; returns its metrics (rollout, actor/*, critic/*, timing/*, perf/*, memory/<phase>/*)."""
        cfg, run, t = self.cfg, self.run, {}
        actor, critic, ref = run.workers["actor"], run.workers.get("critic"), run.workers.get("ref")
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        with self._timed("rollout", t):  # asynchronous: the wait for the next played batch
            batch = self._train_rollout(metrics)
        if not cfg.trainer.async_rollout:  # an asynchronous engine keeps playing during the update
            with self._timed("engine_sleep", t):  # free the engines' memory for training (vLLM sleep mode; hf on GPU)
                run.engine.sleep()
        offload = step_memory.phase_offload(cfg, run.workers)  # None unless trainer.offload resolves to phase
        if offload is not None:
            with self._timed("reload", t):  # the training state back on the GPUs before the first training phase
                offload.reload()
        metrics.update(batch.metrics)
        metrics.update(self._seed_metrics(batch))
        errors = failed_episode_records(batch, run.step + 1)
        if errors:  # masked episodes (env raised, hung or returned garbage): kept with their seeds
            write_jsonl(run.dir / "env_errors.jsonl", errors, append=True)
        self.failed_steps.record(run.step + 1, batch.episodes)  # every episode failing, step after step: stop
        if collapse_due(run.step + 1, cfg.trainer.collapse_every):  # does the policy read its prompts? (no update)
            with self._timed("collapse", t):
                metrics.update(collapse_step_metrics(actor, batch, cfg.trainer.collapse_prompts, run.proxy.pad_id))
        with self._timed("filter", t):
            batch, filter_metrics = credit.filter_groups(batch, cfg.algorithm)
        metrics.update(filter_metrics)
        if batch.batch_size == 0:  # no group carries a reward signal (variance-share filter): nothing to train
            metrics["train/skipped_update"] = 1.0
            console.say(f"[ragen] step {run.step + 1}: no group's rewards vary, so the variance-share filter kept "
                        "nothing and the update is skipped (a task with no reward yet: a warm start, or "
                        "algorithm.rollout_filter=std_ratio)")
            return self._close_step(metrics, t, start, batch, offload, updated=False)
        tb = self.layout.train_batch(batch)
        n_real = tb.batch_size
        tb = self._padded(tb)  # rows that mini-batches and ranks divide
        values = boot = None
        value_group = builders.value_worker(cfg, run.workers)  # the critic, or the actor's shared value head
        old_lp = None  # None: the update is exactly on-policy, its own detached log-probs serve (no gap metric)
        if self._old_log_probs_reader(tb.batch_size, shared_head=value_group is actor) is not None:
            with self._timed("old_log_probs", t):
                if value_group is actor:  # shared value head: log-probs and values from one forward
                    old_lp, values, _ = actor.call("compute_log_probs_and_values", tb)
                else:
                    old_lp = actor.call("compute_log_probs", tb)
            metrics.update(logprob_gap_metrics(batch.sample_log_probs, old_lp[:n_real], batch.response_mask))
        real_old_lp = None if old_lp is None else old_lp[:n_real]
        correction = (credit.Correction(None, None, {}) if old_lp is None
                      else credit.rollout_correction(cfg.algorithm.rollout_correction, batch, real_old_lp))
        metrics.update(correction.metrics)
        ref_lp = None
        if ref is not None or (cfg.actor.lora and uses_kl(cfg)):  # a LoRA actor is its own reference
            with self._timed("ref_log_probs", t):
                ref_lp = (ref.call("compute_log_probs", tb) if ref is not None
                          else actor.call("compute_ref_log_probs", tb))
        if value_group is not None and values is None:
            with self._timed("values", t):
                values, _ = value_group.call("compute_values", tb)
        if value_group is not None and bool(batch.truncated.any()):  # episodes cut by the length budget
            with self._timed("bootstrap_values", t):
                boot = bootstrap_values(value_group, batch, run.proxy.pad_id, self.row_multiple())
        with self._timed("advantages", t):
            real_values = None if values is None else values[:n_real]
            adv, ret, kl_metrics = credit.step_credit(
                cfg.algorithm, self.layout.advantages, batch, real_values, boot, real_old_lp,
                None if ref_lp is None else ref_lp[:n_real])
            metrics.update(kl_metrics)
        if cfg.trainer.report and cfg.trainer.report_train_samples > 0:
            with self._timed("report_samples", t):  # without an old-log-prob pass: its own, over the saved rows
                lp = real_old_lp if real_old_lp is not None else report.rows_log_probs(
                    run, tb, report.train_sample_rows(run, batch), self.row_multiple(), n_real)
                report.save_train_samples(self.run, batch, Credit(adv, ret, real_values, lp), run.step + 1)
        pad = (0, 0, 0, tb.batch_size - n_real)
        tb = tb.with_fields(old_log_probs=old_lp, ref_log_probs=ref_lp, advantages=F.pad(adv, pad),
                            returns=F.pad(ret, pad), values=values,
                            is_weights=_padded(correction.is_weights, pad),
                            keep_mask=_padded(correction.keep_mask, pad))
        bad = numerics.nonfinite_counts(numerics.update_inputs(batch, tb))  # NaN/inf never reaches the weights
        if bad:
            metrics.update(numerics.skip_metrics(bad))
        self._updating = True  # from here until the step is counted, a checkpoint would mix two steps
        if critic is not None and not bad:
            with self._timed("critic_update", t):
                metrics.update(critic.call("update", tb, progress=self._progress("critic")))
        updated = run.step >= cfg.trainer.critic_warmup and not bad
        if updated:
            with self._timed("actor_update", t):
                metrics.update(actor.call("update", tb, progress=self._progress("actor")))
        metrics.update(batch_metrics(batch, adv, ret, real_values))
        metrics = self._close_step(metrics, t, start, batch, offload, updated)
        self.skips.record(run.step + 1, bad or numerics.gradient_skips(metrics))
        return metrics

    def _close_step(self, metrics: dict[str, float], t: dict[str, float], start: float, batch: Any, offload: Any,
                    updated: bool) -> dict[str, float]:
        """The end of a step: wake the engine (with the new weights when ``updated``), then the step's timings
        (``t``, the whole step since ``start``), throughput over ``batch`` and memory metrics into ``metrics``."""
        run = self.run
        with self._timed("weight_sync", t):  # wake weights -> sync -> wake KV cache (placement.wake_and_sync)
            if isinstance(run.engine, VersionedEngine):  # the new weights and their version, between forward passes
                run.engine.publish(run.step + 1, self._weight_sync if updated else None)
            else:
                placement.wake_and_sync(run.engine, self._weight_sync if updated else None, offload)
        step_s = time.perf_counter() - start
        if self.queue is not None:  # waiting for a batch, or for the batch in flight before the weights load
            metrics["async/sync_wait_s"] = run.engine.publish_wait_s
            metrics["async/trainer_idle_frac"] = min(1.0, (t["rollout"] + run.engine.publish_wait_s) / step_s)
        metrics.update({f"timing/{k}": v for k, v in t.items()})
        metrics["timing/step"] = step_s
        if self._report_seconds is not None:
            metrics["timing/report"], self._report_seconds = self._report_seconds, None
        metrics.update(perf_metrics(batch, step_s, t))
        metrics.update(step_memory.step_metrics(run.workers, offload))
        return metrics

    def _train_rollout(self, metrics: dict[str, float]) -> Any:
        """This step's training batch: played now, or (``trainer.async_rollout``) the next one the rollout queue
        played, its ``async/*`` metrics into ``metrics`` (``ragen.ppo.async_rollout``)."""
        tr, run = self.cfg.trainer, self.run
        if not tr.async_rollout:
            return run.proxy.rollout("train")
        if self.queue is None:  # started at the first step (after any warm start), or after a restart
            self.queue = RolloutQueue(run.proxy, run.engine, max_staleness=tr.max_staleness,
                                      stale_policy=tr.stale_policy, partial=tr.partial_rollouts, first=run.step,
                                      last=tr.total_steps).start()
        item, queue_metrics = self.queue.get(run.step)
        metrics.update(queue_metrics)
        self._consumed_proxy = item.proxy_state
        return item.batch

    def _padded(self, tb: Any) -> Any:
        """``tb`` with empty rows appended so mini-batches and ranks divide it: the layout's padding, and always
        with the variance-share filter or dropped stale groups (the number of groups follows the batch)."""
        multiple, pad_id = self.row_multiple(), self.run.proxy.pad_id
        if self.cfg.algorithm.rollout_filter == "variance_share" or self.cfg.trainer.stale_policy == "drop":
            return layout.pad_rows(tb, multiple, pad_id)
        return self.layout.padded(tb, multiple, pad_id)

    def sync_engine_weights(self) -> None:
        """Wake the engine's weights, give it the actor's current weights, wake its KV cache
        (``placement.wake_and_sync``): the first load, a resume, a restart, the warm start. With
        ``trainer.offload=phase`` the training state leaves the GPUs before each wake, as in a step, so the rollout
        that follows (the first one, or validation) has the GPUs to itself."""
        offload = step_memory.phase_offload(self.cfg, self.run.workers)
        placement.wake_and_sync(self.run.engine, self._weight_sync, offload)

    def _weight_sync(self) -> Any:
        """The actor's weights to the engine, never through this process where workers host the engines: each
        actor rank loads its own engine (``HostedEngines.sync_weights``), or rank 0 broadcasts to a separately
        placed vLLM engine over NCCL. An engine set from outside (tests' scripted engines) gets the full state
        dict (``Run.push_actor_weights``)."""
        sync = getattr(self.run.engine, "sync_weights", None)  # engines hosted by the actor's ranks (HostedEngines)
        if sync is not None:
            return sync()
        if not self.nccl:
            return self.run.push_actor_weights()
        from ragen.rollout.vllm_engine import DEFAULT_BUCKET_BYTES

        dtype, _ = resolve_dtype(self.cfg.rollout.dtype, "cuda")
        return placement.nccl_sync(self.run.engine, self.run.workers["actor"], dtype, DEFAULT_BUCKET_BYTES,
                                   timeout_s=self.cfg.trainer.worker_call_timeout_s)

    @contextmanager
    def _timed(self, name: str, timings: dict[str, float]) -> Iterator[None]:
        """``timed`` that also records the running phase (named by :meth:`_guarded` when a worker fails) and, for
        the engine's phases, their memory peak in this process (``step_memory.DRIVER_PHASES``)."""
        self.phase = name
        with timed(name, timings), PHASE_MEMORY.measure(name if name in step_memory.DRIVER_PHASES else None):
            yield

    def _guarded(self, fn: Callable[[], Any], phase: str | None = None, step: int | None = None) -> Any:
        """Run one part of the loop (a step, a validation, the warm start, a save); a dead or hung worker
        (``WorkerFailure``) stops the run naming the step, the phase and the checkpoint to resume from (the last
        complete one: an interrupted save never counts). ``phase``: the phase name for parts that do not name
        their own (``_timed``); ``step``: the step to report (default: the one being trained, or saved)."""
        if phase is not None:
            self.phase = phase
        try:
            return fn()
        except WorkerFailure as exc:
            last = latest_checkpoint(self.run.ckpt_root)
            if step is None:
                step = self.run.step if self.phase == "checkpoint" else self.run.step + 1
            raise WorkerFailure(f"{exc}; in phase {self.phase!r} of step {step}. Last complete checkpoint: "
                                f"{last or '(none)'}; rerun with trainer.resume=auto to continue from it") from exc

    def _progress(self, role: str) -> tuple[int, int] | None:
        """(this step's update of ``role``, the run's updates of it) for the lr schedule, which then follows the
        run's fraction (``Trainable.update``); None where ``<role>.total_steps`` is set (a horizon in optimizer
        steps). The actor's updates start after ``trainer.critic_warmup``."""
        if getattr(self.cfg, role).total_steps is not None:
            return None
        skip = self.cfg.trainer.critic_warmup if role == "actor" else 0
        return self.run.step - skip, max(1, self.cfg.trainer.total_steps - skip)

    def _old_log_probs_reader(self, rows: int, shared_head: bool) -> str | None:
        """What needs this step's old-log-prob pass over ``rows`` padded rows (``credit.old_log_probs_reader``);
        None: the actor's update is exactly on-policy and the pass is skipped."""
        cfg = self.cfg
        return credit.old_log_probs_reader(
            ppo_epochs=cfg.actor.ppo_epochs, mini_batch_size=cfg.actor.mini_batch_size, rows=rows,
            correction_mode=cfg.algorithm.rollout_correction.mode, kl_in_reward=cfg.algorithm.kl_in_reward,
            shared_value_head=shared_head)

    def row_multiple(self) -> int:
        cfg = self.cfg
        sizes = [cfg.actor.mini_batch_size, *(world_size(cfg, r) for r in ("actor", "critic", "ref"))]
        if self.run.workers.get("critic") is not None:
            sizes.append(cfg.critic.mini_batch_size)
        return layout.row_multiple(*sizes)

    @staticmethod
    def _seed_metrics(batch) -> dict[str, float]:
        seeds = [ep.seed for ep in batch.episodes]
        return {"rollout/seed_min": float(min(seeds)), "rollout/seed_max": float(max(seeds))} if seeds else {}

    def validate(self, suffix: str = "") -> dict[str, float]:
        """Roll out the validation groups (fixed seeds), dump them as JSONL (``val_rollouts/step_N<suffix>.jsonl``),
        return ``val/...`` metrics.

        The global RNG state is restored afterwards, so validating never changes the training randomness.
        """
        t: dict[str, float] = {}
        with rng_preserved(), self._timed("validation", t):
            batch = self.run.val_proxy.rollout("val")
        records = episode_records(batch)
        if self.cfg.trainer.report and self.cfg.trainer.report_val_samples != 0:  # + token rows with log-probs,
            with rng_preserved(), self._timed("val_credit", t):  # values and advantages, for the step page
                records = report.val_records(self.run, batch, self.row_multiple())
        write_jsonl(self.run.dir / "val_rollouts" / f"step_{self.run.step}{suffix}.jsonl", records)
        out = {f"val/{k}": v for k, v in batch.metrics.items()}
        out["val/reward/mean"] = float(credit.trajectory_rewards(batch).mean())
        out.update({f"timing/{k}": v for k, v in t.items()})
        return out

    def write_report(self) -> None:
        """Refresh ``report/`` (``ragen.report``) after a validation was logged: the index and the pages of the
        steps saved since the last refresh. Its time is logged with the next step as ``timing/report``."""
        if not self.cfg.trainer.report:
            return
        t: dict[str, float] = {}
        with timed("report", t):
            records = None if "jsonl" in self.cfg.trainer.loggers else self.run.history
            build_report(self.run.dir, steps=pending_steps(self.run.dir, self.run.step), records=records)
        self._report_seconds = t["report"]

    def evaluate(self) -> dict[str, float]:
        """``trainer.val_only``: validate the policy of the resumed checkpoint (or the initial model) once."""
        metrics = self.validate()
        self.run.log(metrics, self.run.step)
        self.write_report()
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Actor / critic (weights + optimizer) and trainer state into ``checkpoints/global_step_<step>``, then the
        learning curve."""
        self.phase = "checkpoint"
        path = self.run.write_checkpoint()
        tqdm.write(f"[ragen] saved checkpoint {path}")
        self.run.plot()
        return path

    def load_checkpoint(self, path: Path, *, with_workers: bool = True) -> None:
        """Restore workers (or, without them, the engine's weights), step, RNG and seed counters."""
        self.run.read_checkpoint(path, self.sync_engine_weights, with_workers=with_workers)
        if isinstance(self.run.engine, VersionedEngine):  # the checkpoint's weights are the version of its step
            self.run.engine.reset_version(self.run.step)
        console.say(f"[ragen] resumed from {path} at step {self.run.step}")


def run(cfg: TrainConfig) -> dict[str, float]:
    """The PPO family's job: validate ``cfg`` (``ragen.trainer.config.ppo_checks.validate_ppo``, before anything
    starts), then train, or evaluate when ``trainer.val_only``; returns the final metrics. Workers, Ray (when this call
    started it) and loggers are shut down even on errors. ``ragen.launch.run`` calls it for ``algorithm.name=ppo``."""
    from ragen.trainer.config.ppo_checks import validate_ppo

    validate_ppo(cfg)
    trainer = PPOTrainer(cfg)
    started_ray = _ray_running() is False
    try:
        trainer.setup(with_workers=not cfg.trainer.val_only)
        return trainer.evaluate() if cfg.trainer.val_only else trainer.fit()
    finally:
        trainer.shutdown()
        if started_ray and cfg.trainer.use_ray and not cfg.trainer.val_only:
            import ray

            ray.shutdown()


def _padded(rows: torch.Tensor | None, pad: tuple[int, int, int, int]) -> torch.Tensor | None:
    """``rows`` (B_real, T) padded with zero rows to the train batch (None stays None)."""
    return None if rows is None else F.pad(rows, pad)


def _ray_running() -> bool | None:
    """Whether Ray is initialised in this process; None when Ray is not installed."""
    try:
        import ray
    except ImportError:
        return None
    return ray.is_initialized()
