"""One job of either algorithm family from a frozen config: check it, print its plan, train (or evaluate).

``algorithm.name`` picks the family: ``ppo`` runs the PPO trainer (``ragen.trainer``: every advantage estimator of
``ragen.algorithms``), ``archer`` | ``chai`` | ``filtered_bc`` the ArCHer family (``ragen.archer``). This module
sits above both, so neither trainer imports the other: :func:`validate` and :func:`run` dispatch on the name, and
``python -m ragen.train`` hands an ArCHer-family config to the ArCHer trainer. The commands (``ragen.cli``) call
:func:`cli_main`; Python code calls :func:`run` on a ``TrainConfig``
(``ragen.trainer.config.compose.load_train_config``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragen.trainer.config.schema import TrainConfig
from ragen.utils import console

# The trainers (torch, Ray, the envs) are imported when a job needs them, so importing this module stays light.


def validate(cfg: TrainConfig) -> None:
    """Raise ``ConfigError`` listing every problem of ``cfg`` (nothing is started before this passes): the checks of
    its family (``ragen.trainer.config.preflight.preflight``; the PPO family's, ``ragen.trainer.config.ppo_checks``, or
    the ArCHer family's, ``ragen.archer.main``, by ``algorithm.name``)."""
    import ragen.archer.main  # noqa: F401  (registers the ArCHer family's checks)
    import ragen.trainer.config.ppo_checks  # noqa: F401  (registers the PPO family's checks)
    from ragen.trainer.config.preflight import preflight

    preflight(cfg)


def run(cfg: TrainConfig) -> dict[str, float]:
    """Validate ``cfg`` (before anything starts), then train, or evaluate when ``trainer.val_only``.

    Returns the final metrics. Workers, Ray (when this call started it) and loggers are shut down even on
    errors. ``algorithm.name`` archer / chai / filtered_bc runs the ArCHer family's trainer
    (``ragen.archer.main.run``), ppo the PPO trainer (``ragen.ppo.trainer.run``). ``trainer.dry_run``:
    print the plan (``ragen.trainer.dry_run``) and return {}.
    """
    from ragen.plugins import load_plugins

    load_plugins(cfg.imports)  # a config built in Python (not composed from the command line) names its plugins here
    if cfg.trainer.dry_run:
        from ragen.trainer.dry_run import dry_run

        console.say(dry_run(cfg, validate))
        return {}
    if cfg.algorithm.name != "ppo":
        from ragen.archer.main import run as run_archer

        return run_archer(cfg)
    from ragen.ppo.trainer import run as run_ppo

    return run_ppo(cfg)


def _command_line_overrides() -> list[str]:
    """The overrides of the running Hydra command (``key=value`` items of its command line)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not under @hydra.main
        return []


def run_cli(cfg: TrainConfig, label: str = "done",
            runner: Callable[[TrainConfig], dict[str, float]] | None = None) -> dict[str, float]:
    """``runner`` (default :func:`run`; ``ragen.archer.main.run`` for ``ragen archer``) behind the quiet console
    (``trainer.verbose=false``: the rest of the output in ``<run dir>/train.log``), then the final summary on the
    terminal."""
    log_path = Path(cfg.trainer.output_dir) / "train.log"
    with console.quiet_console(log_path, verbose=cfg.trainer.verbose):
        metrics = (runner or run)(cfg)
        console.say(final_summary(cfg, metrics, label, None if cfg.trainer.verbose else log_path))
    return metrics


def final_summary(cfg: TrainConfig, metrics: dict[str, float], label: str = "done",
                  log_path: Path | None = None) -> str:
    """The last lines of a run: its final validation and rewards, then where its outputs are."""
    run_dir = Path(cfg.trainer.output_dir)
    keys = [k for k in sorted(metrics) if k == "val/reward/mean"
            or (k.startswith("val/env/") and k.endswith(("/success", "/format_ok", "/reward")))]
    lines = [f"[ragen] {label}: " + ", ".join(f"{k}={metrics[k]:.4g}" for k in keys)]
    ckpts = sorted((run_dir / "checkpoints").glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    paths = [("metrics", run_dir / "metrics.jsonl"), ("curve", run_dir / "learning_curve.png"),
             ("report", run_dir / "report" / "index.html"), ("checkpoint", ckpts[-1] if ckpts else None),
             ("log", log_path)]
    lines += [f"[ragen] {name:<10} {path}" for name, path in paths if path is not None and Path(path).exists()]
    return "\n".join(lines)


def cli_main(cfg: Any, check: Callable[[TrainConfig], None], label: str = "done",
             runner: Callable[[TrainConfig], dict[str, float]] | None = None,
             transform: Callable[[TrainConfig], TrainConfig] | None = None) -> dict[str, float]:
    """The body of a Hydra entry point: build the frozen config (then ``transform`` it, e.g. ``ragen sft``'s
    warm-start-only job, ``ragen.trainer.warm_start.sft_config``), ``check`` it and run the pre-start checks
    (``ragen.trainer.config.resource_checks``: the model loads, the output folder holds no run with another config); a
    ``ConfigError`` exits with status 2 and one line per
    problem, before anything is written or started. ``trainer.dry_run``: print the plan and return {} (exit 0).
    Else :func:`run_cli`."""
    import sys

    from ragen.trainer.config.compose import to_train_config
    from ragen.trainer.config.resource_checks import check_before_start
    from ragen.trainer.config.schema import ConfigError
    from ragen.trainer.config.unread_keys import command_line_keys, explicit_keys
    from ragen.trainer.dry_run import dry_run
    from ragen.utils.interrupts import signals_stop_the_run

    try:
        train_cfg = to_train_config(cfg)
        if transform is not None:
            train_cfg = transform(train_cfg)
        with explicit_keys(command_line_keys(_command_line_overrides())):
            if train_cfg.trainer.dry_run:
                print(dry_run(train_cfg, check))
                return {}
            check(train_cfg)
        check_before_start(train_cfg)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    try:
        with signals_stop_the_run():
            return run_cli(train_cfg, label=label, runner=runner)
    except console.STOPS as exc:  # a stated reason: the quiet console has printed it as one line
        if train_cfg.trainer.verbose:
            print(f"[ragen] {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
