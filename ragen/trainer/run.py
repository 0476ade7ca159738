"""What a run has, whatever its algorithm: :class:`Run`, held (not inherited) by the PPO trainer
(``ragen.ppo.trainer.PPOTrainer``) and the ArCHer family's (``ragen.archer.trainer.ArcherTrainer``).

A run is the frozen config and everything that exists because the job runs: the run folder and its checkpoints,
the policy's model folder and tokenizer, the worker groups, the rollout engine, the agent proxies, the metric
loggers and history, and the trainer state a checkpoint records (step, RNG and the proxy's seed counters after the
last complete step, warm start done). A trainer builds the workers, engine and proxies into its run and drives
them; the run keeps them and does what is the same for every algorithm:

* set-up: the model folder and tokenizer (``builders.prepare_model``, before anything is written, so a bad model
  path fails first), then the run folder (``builders.prepare_run``: ``config.json``, seeds, threads); once the
  workers exist, the start-up block on the console (``builders.startup_block``); once the engine and proxies
  exist, the resume (:meth:`Run.open`: ``trainer.resume``, ``ragen.utils.checkpoint.resolve_resume``), the metrics
  history cut back to the resumed step, and the metric loggers (``builders.tracker``);
* the checkpoint policy: validation and checkpoints fall due every ``trainer.val_freq`` / ``trainer.save_freq``
  steps and at the last step; a checkpoint ``checkpoints/global_step_<step>`` holds the actor and critic groups'
  weights and optimizer states, the trainer state (``trainer_state.pt``) and whatever the trainer adds, written
  atomically and pruned to ``trainer.keep_last_ckpt`` (``ragen.utils.checkpoint.write_checkpoint``);
* tear-down, memory metrics, the metric log and the learning curve.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ragen.trainer import builders
from ragen.trainer.config.schema import TrainConfig
from ragen.trainer.state import save_trainer_state, trim_metrics
from ragen.utils import console
from ragen.utils.checkpoint import reference_dir, resolve_resume, write_checkpoint
from ragen.utils.memory import memory_stats
from ragen.utils.seeding import get_rng_state, set_rng_state

CHECKPOINTED_ROLES = ("actor", "critic")  # worker groups whose weights and optimizer states a checkpoint holds


class Run:
    """The config, folders, workers, engine, proxies, loggers and trainer state of one run (see the module doc).

    ``workers`` maps a role to its worker group (None where the role is off); ``engine`` is the rollout engine the
    proxies play through; ``proxy`` / ``val_proxy`` the train and validation agent proxies; ``step`` the complete
    steps so far; ``history`` the logged metric records (the learning curve's data)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.trainer.output_dir)
        self.ckpt_root = self.dir / "checkpoints"
        self.model_path: str | None = None
        self.tokenizer: Any = None
        self.workers: dict[str, Any] = {}
        self.engine: Any = None
        self.proxy: Any = None
        self.val_proxy: Any = None
        self.tracker: Any = None
        self.history: list[dict[str, float]] = []
        self.step = 0
        self.warm_started = False
        # the RNG and the train proxy's seed counters after the last complete step: a checkpoint written while the
        # next step's rollout has advanced them (a stop by signal) records these (None: take them at the save)
        self.rng_after_step: dict[str, Any] | None = None
        self.proxy_after_step: dict[str, int] | None = None

    # ------------------------------------------------------------------ set-up / tear-down
    def prepare(self) -> None:
        """The policy's model folder and tokenizer (a bad model path fails before any write), then the run folder."""
        self.model_path, self.tokenizer = builders.prepare_model(self.cfg)
        builders.prepare_run(self.cfg, self.dir)

    def announce(self) -> None:
        """The start-up block on the console: model, precision, workers, envs, estimator or algorithm, run folder
        (the lines the dry run's plan starts with)."""
        console.say(builders.startup_block(self.cfg, self.model_path, os.environ.get(console.LOG_VAR)))

    def record_placement(self) -> None:
        """``placement.json`` (where each Ray worker runs) and its line on the console (none without Ray)."""
        where = builders.record_placement(self.workers, self.dir)
        if where:
            console.say(where)

    def open(self, load: Callable[[Path], None]) -> Path | None:
        """After the workers, engine and proxies exist: resume from the checkpoint ``trainer.resume`` names (if any;
        ``load(path)`` restores it: the trainer's own contents on top of :meth:`read_checkpoint`), keep the metrics
        history up to the resumed step, start the loggers. Returns the checkpoint resumed from, or None."""
        resumed = resolve_resume(self.cfg.trainer.resume, self.ckpt_root)
        if resumed is not None:
            load(resumed)
        self.history = trim_metrics(self.dir / "metrics.jsonl", None if resumed is None else self.step)
        self.tracker = builders.tracker(self.cfg, self.dir, resumed=resumed is not None)
        return resumed

    def shutdown(self) -> None:
        """Stop every worker group and close the loggers (safe to call twice, or after a failed set-up)."""
        self.stop_workers()
        if self.tracker is not None:
            self.tracker.finish()
            self.tracker = None

    def stop_workers(self) -> None:
        """Stop every worker group (a restart's first act: the survivors too)."""
        for group in self.workers.values():
            if group is not None:
                group.shutdown()
        self.workers = {}

    # ------------------------------------------------------------------ steps and the checkpoint policy
    def complete_step(self) -> None:
        """Count the step just trained and remember the RNG and the train proxy's seed counters after it."""
        self.step += 1
        self.rng_after_step, self.proxy_after_step = get_rng_state(), self.proxy.state_dict()

    def rewind(self, step: int) -> None:
        """Back to the state after ``step`` (a restart from that step's checkpoint): the history and
        ``metrics.jsonl`` drop what was logged past it, and the after-step records are forgotten."""
        self.step = step
        self.rng_after_step = self.proxy_after_step = None
        self.history = [r for r in self.history if r.get("step", 0) <= step]
        trim_metrics(self.dir / "metrics.jsonl", step)  # the logger appends after the kept records

    def due(self, freq: int) -> bool:
        """Whether an event every ``freq`` steps (``trainer.val_freq``, ``trainer.save_freq``; 0 = only at the end)
        falls due after the step just taken: at multiples of ``freq`` and at the last step."""
        return self.step == self.cfg.trainer.total_steps or (freq > 0 and self.step % freq == 0)

    def write_checkpoint(self, extra: Callable[[Path], None] | None = None, **state: Any) -> Path:
        """``checkpoints/global_step_<step>``: the actor and critic groups (weights + optimizer), ``extra(folder)``
        (e.g. a replay buffer), then the trainer state (step, RNG after the step, the proxy's seed counters, warm
        start done, plus ``state``). Written to a temporary folder and renamed, so an interrupted save never
        counts; older checkpoints beyond ``trainer.keep_last_ckpt`` are removed."""

        def write(tmp: Path) -> None:
            for role in CHECKPOINTED_ROLES:
                if self.workers.get(role) is not None:
                    self.workers[role].call("save", dir=str(tmp / role))
            if extra is not None:
                extra(tmp)
            save_trainer_state(tmp / "trainer_state.pt", step=self.step, rng=self.rng_after_step or get_rng_state(),
                               proxy=self.proxy_after_step or self.proxy.state_dict(),
                               warm_started=self.warm_started, **state)

        return write_checkpoint(self.ckpt_root, self.step, write, keep_last=self.cfg.trainer.keep_last_ckpt)

    def read_checkpoint(self, path: Path, sync_engine: Callable[[], Any], *, with_workers: bool = True
                        ) -> dict[str, Any]:
        """Restore a complete checkpoint: the actor and critic groups (``with_workers``, then ``sync_engine()``
        gives the engine their weights; else only the engine gets the actor's saved weights), the reference after a
        warm start (``reference_dir``: the policy RL started from), step, warm start, RNG and the proxy's seed
        counters. Returns the trainer state, for what the trainer saved besides."""
        path = Path(path)
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        if with_workers:
            for role in CHECKPOINTED_ROLES:
                if self.workers.get(role) is not None:
                    self.workers[role].call("load", dir=str(path / role))
            reference = reference_dir(self.dir)
            if state.get("warm_started") and self.workers.get("ref") is not None and reference.is_dir():
                self.workers["ref"].call("load", dir=str(reference))  # the policy RL started from
            sync_engine()
        else:
            from safetensors.torch import load_file

            weights: dict[str, torch.Tensor] = {}
            for f in sorted((path / "actor").glob("*.safetensors")):
                weights.update(load_file(f))
            self.engine.update_weights(weights)
        self.step = int(state["step"])
        self.warm_started = bool(state.get("warm_started", False))
        set_rng_state(state["rng"])
        self.proxy.load_state_dict(state["proxy"])
        return state

    def push_actor_weights(self) -> Any:
        """The actor's full state dict (gathered by its rank 0) into an engine that lives in this process (the
        ArCHer family's engine, tests' scripted engines)."""
        return self.engine.update_weights(self.workers["actor"].call_rank0("full_state_dict"))

    # ------------------------------------------------------------------ metrics
    def memory_metrics(self) -> dict[str, float]:
        """``memory/<process>_rss_gb`` (now) and ``_peak_gb`` (so far) of the driver and of each worker role (mean
        over its ranks, the actor's with its hosted engine; in-process workers count as the driver), and
        ``memory/<role>_nice``, the workers' niceness (``ragen.utils.process``). Growth from step to step is a leak."""
        out = {f"memory/driver_{k}": v for k, v in memory_stats().items()}
        if self.cfg.trainer.use_ray:
            for role, group in self.workers.items():
                if group is not None:
                    out.update({f"memory/{role}_{k}": v for k, v in group.call("memory_stats").items()})
        return out

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Send ``metrics`` of ``step`` to the loggers and keep them in the history (the learning curve's data)."""
        if self.tracker is not None:
            self.tracker.log(metrics, step)
        self.history.append({"step": step, **metrics})

    def plot(self) -> Path:
        """``learning_curve.png`` of the history so far (its title, the experiment name, is drawn: redacted)."""
        from ragen.utils.plotting import plot_learning_curves
        from ragen.utils.redaction import redact_text

        return plot_learning_curves(self.history, self.dir / "learning_curve.png",
                                    title=redact_text(self.cfg.trainer.experiment_name))
