"""What every trainer of a run shares, whatever its algorithm: :class:`Driver`, the base of the PPO trainer
(``ragen.trainer.ppo_trainer.PPOTrainer``) and the ArCHer family's (``ragen.archer.trainer.ArcherTrainer``).

The driver is the process that owns the run: it holds the frozen config and the trainer state (step, RNG after the
last step, history, warm start done), and talks to worker groups, the engine and the agent proxies. Shared here:

* the run's set-up: the policy's model folder and tokenizer (``builders.prepare_model``, before anything is
  written, so a bad model path fails first), then the run folder (``builders.prepare_run``: ``config.json``, seeds,
  threads); once the workers exist, the start-up block on the console (``builders.startup_block``); once the engine
  and proxies exist, the resume (``trainer.resume``, ``ragen.utils.checkpoint.resolve_resume``), the metrics history
  cut back to the resumed step, and the metric loggers (``builders.tracker``);
* the checkpoint policy: validation and checkpoints fall due every ``trainer.val_freq`` / ``trainer.save_freq``
  steps and at the last step; a checkpoint ``checkpoints/global_step_<step>`` holds the actor and critic groups'
  weights and optimizer states, the trainer state (``trainer_state.pt``) and whatever the trainer adds, written
  atomically and pruned to ``trainer.keep_last_ckpt`` (``ragen.utils.checkpoint.write_checkpoint``);
* tear-down, memory metrics, the metric log and the learning curve.

A trainer subclasses :class:`Driver`, builds its worker groups (then :meth:`announce`), engine and proxies between
:meth:`prepare` and :meth:`open_run`, and adds its own loop and checkpoint contents (the :meth:`write_checkpoint`
and :meth:`read_checkpoint` hooks).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ragen.trainer import builders, numerics
from ragen.trainer.config import TrainConfig
from ragen.trainer.state import save_trainer_state, trim_metrics
from ragen.utils import console
from ragen.utils.checkpoint import reference_dir, resolve_resume, write_checkpoint
from ragen.utils.memory import memory_stats
from ragen.utils.seeding import get_rng_state, set_rng_state

CHECKPOINTED_ROLES = ("actor", "critic")  # worker groups whose weights and optimizer states a checkpoint holds


class Driver:
    """The run-level state and set-up both trainers share (see the module docstring)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.trainer.output_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.workers: dict[str, Any] = {}
        self.tracker: Any = None
        self.warm_started = False
        self.val_suffix = ""  # the warm start's validation writes val_rollouts/step_0_after_warm_start.jsonl
        self._rng_after_step: dict[str, Any] | None = None
        self.skips = numerics.SkipGuard(cfg.trainer.max_consecutive_skips)
        self.failed_steps = numerics.FailedEpisodesGuard(cfg.trainer.max_failed_steps)
        # the agent proxy's seed counters after the last complete step: a checkpoint written while the next step's
        # rollout has advanced them (a stop by signal) records these, as it records the RNG after the step
        self._proxy_after_step: dict[str, int] | None = None
        self.proxy: Any = None
        self.engine: Any = None

    # ------------------------------------------------------------------ set-up / tear-down
    def prepare(self) -> None:
        """The policy's model folder and tokenizer (a bad model path fails before any write), then the run folder."""
        self.model_path, self.tokenizer = builders.prepare_model(self.cfg)
        builders.prepare_run(self.cfg, self.run_dir)

    def announce(self) -> None:
        """The start-up block on the console: model, precision, workers, envs, estimator or algorithm, run folder
        (the lines the dry run's plan starts with)."""
        console.say(builders.startup_block(self.cfg, self.model_path, os.environ.get(console.LOG_VAR)))

    def open_run(self, **load: Any) -> Path | None:
        """After the workers, engine and proxies exist: resume from the checkpoint ``trainer.resume`` names (if any;
        ``load`` goes to :meth:`load_checkpoint`), keep the metrics history up to the resumed step, start the
        loggers. Returns the checkpoint resumed from, or None for a fresh start."""
        resumed = resolve_resume(self.cfg.trainer.resume, self.ckpt_root)
        if resumed is not None:
            self.load_checkpoint(resumed, **load)
        self.history = trim_metrics(self.run_dir / "metrics.jsonl", None if resumed is None else self.step)
        self.tracker = builders.tracker(self.cfg, self.run_dir, resumed=resumed is not None)
        return resumed

    def shutdown(self) -> None:
        """Stop every worker group and close the loggers (safe to call twice, or after a failed set-up)."""
        for group in self.workers.values():
            if group is not None:
                group.shutdown()
        self.workers = {}
        if self.tracker is not None:
            self.tracker.finish()
            self.tracker = None

    # ------------------------------------------------------------------ the checkpoint policy
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
            save_trainer_state(tmp / "trainer_state.pt", step=self.step, rng=self._rng_after_step or get_rng_state(),
                               proxy=self._proxy_after_step or self.proxy.state_dict(),
                               warm_started=self.warm_started, **state)

        return write_checkpoint(self.ckpt_root, self.step, write, keep_last=self.cfg.trainer.keep_last_ckpt)

    def read_checkpoint(self, path: Path, *, with_workers: bool = True) -> dict[str, Any]:
        """Restore a complete checkpoint: the actor and critic groups (``with_workers``; else only the engine gets
        the actor's saved weights), the reference after a warm start (``reference_dir``: the policy RL started from),
        the engine's weights, step, warm start, RNG and the proxy's seed counters.
        Returns the trainer state for what the subclass saved besides."""
        path = Path(path)
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        if with_workers:
            for role in CHECKPOINTED_ROLES:
                if self.workers.get(role) is not None:
                    self.workers[role].call("load", dir=str(path / role))
            reference = reference_dir(self.run_dir)
            if state.get("warm_started") and self.workers.get("ref") is not None and reference.is_dir():
                self.workers["ref"].call("load", dir=str(reference))  # the policy RL started from
            self.sync_engine_weights()
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

    def sync_engine_weights(self) -> Any:
        """The actor's current weights into the engine (after a checkpoint load, the warm start, an update). Here:
        an engine in the driver gets the actor's full state dict; the PPO trainer's engines, hosted by the actor's
        ranks or placed on GPUs of their own, load them without the driver (``PPOTrainer.sync_engine_weights``)."""
        return self.engine.update_weights(self.workers["actor"].call_rank0("full_state_dict"))

    def load_checkpoint(self, path: Path, **kwargs: Any) -> None:
        """Restore the checkpoint at ``path`` (the subclass's own contents on top of :meth:`read_checkpoint`)."""
        self.read_checkpoint(path, **kwargs)

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

    def _log(self, metrics: dict[str, float], step: int) -> None:
        """Send ``metrics`` of ``step`` to the loggers and keep them in the history (the learning curve's data)."""
        if self.tracker is not None:
            self.tracker.log(metrics, step)
        self.history.append({"step": step, **metrics})

    def plot(self) -> Path:
        """``learning_curve.png`` of the history so far (its title, the experiment name, is drawn: redacted)."""
        from ragen.utils.plotting import plot_learning_curves
        from ragen.utils.redaction import redact_text

        return plot_learning_curves(self.history, self.run_dir / "learning_curve.png",
                                    title=redact_text(self.cfg.trainer.experiment_name))
