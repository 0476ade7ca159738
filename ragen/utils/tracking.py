"""Metric loggers: a console table, a JSONL file and wandb, behind one ``Tracker``.

Metric names are namespaced (``env/<name>/success``, ``actor/pg_loss``, ``timing/rollout``,
``perf/tokens_per_s``...). Every logger gets the same flat ``{name: float}`` dict per step.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from ragen.utils.redaction import redact, redact_text

KNOWN_LOGGERS = ("console", "jsonl", "wandb")


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


def format_table(metrics: dict[str, float], step: int, width: int = 120) -> str:
    """Render ``metrics`` as a two-column table sorted by name, e.g. ``actor/pg_loss   -0.0123``."""
    if not metrics:
        return f"step {step}: (no metrics)"
    items = sorted(metrics.items())
    key_w = max(len(k) for k, _ in items)
    cells = [f"{k:<{key_w}}  {_fmt(v):>11}" for k, v in items]
    cell_w = max(len(c) for c in cells)
    cols = max(1, width // (cell_w + 3))
    rows = [" | ".join(c.ljust(cell_w) for c in cells[i : i + cols]) for i in range(0, len(cells), cols)]
    rule = "-" * min(width, max(len(r) for r in rows))
    return "\n".join([f"step {step}", rule, *rows, rule])


def _fmt(v: float) -> str:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    if isinstance(v, int) or float(v).is_integer() and abs(v) < 1e9:
        return f"{int(v)}"
    return f"{v:.4g}"


# What the quiet console's per-step table shows (every metric is in metrics.jsonl, train.log and wandb).
CONSOLE_SUFFIXES = ("/success", "/format_ok", "reward/mean", "sft/loss", "actor/pg_loss", "actor/entropy",
                    "actor/kl_loss", "critic/vf_loss", "critic/vf_explained_var", "timing/step", "timing/validation",
                    "timing/sft_update", "/failed", "rollout/env_errors")


def console_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The key metrics of a step: success and format rates per env, mean rewards, the main losses, step time and
    the peak memory summed over the processes (``memory/total_peak_gb``)."""
    out = {k: v for k, v in metrics.items() if k.endswith(CONSOLE_SUFFIXES) and "/agent/" not in k}
    peaks = [v for k, v in metrics.items() if k.startswith("memory/") and k.endswith("_peak_gb")]
    if peaks:
        out["memory/total_peak_gb"] = float(sum(peaks))
    return out


def bar_postfix(metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's short summary of a step: mean reward, training success and the last validation success
    (per env, named by env when a run has several), and the episodes whose env failed, when any did."""
    out = {"reward": f"{metrics.get('reward/mean', float('nan')):.3f}"}
    if metrics.get("rollout/env_errors", 0) > 0:
        out["env_errors"] = f"{int(metrics['rollout/env_errors'])}"
    for prefix, short in (("env/", "success"), ("val/env/", "val")):
        rates = {k[len(prefix):-len("/success")]: v for k, v in metrics.items()
                 if k.startswith(prefix) and k.endswith("/success")}
        for env, v in rates.items():
            out[short if len(rates) == 1 else f"{short}/{env}"] = f"{v:.2f}"
    return out


class ConsoleLogger:
    """Prints one metrics table per step through ``tqdm.write`` (so progress bars stay intact): every metric, or
    under the quiet console (``ragen.utils.console``) :func:`console_metrics` on the terminal and every metric in
    ``train.log``."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        from ragen.utils import console

        if console.is_quiet():
            tqdm.write(format_table(metrics, step), file=sys.stdout)
            tqdm.write(format_table(console_metrics(metrics), step), file=console.out_stream())
        else:
            tqdm.write(format_table(metrics, step), file=console.out_stream())

    def finish(self) -> None:
        return None


class JsonlLogger:
    """Appends ``{"step": n, **metrics}`` lines to ``path`` (flushed per step, so a crash loses nothing)."""

    def __init__(self, path: str | Path, append: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a" if append else "w", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._fh.write(json.dumps({"step": step, **metrics}) + "\n")
        self._fh.flush()

    def finish(self) -> None:
        self._fh.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics JSONL file, in order."""
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def wandb_mode() -> str:
    """``WANDB_MODE`` when set; else ``online`` only with an API key and a reachable server, else ``offline``."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = bool(os.environ.get("WANDB_API_KEY"))
    netrc = Path.home() / ".netrc"
    if not has_key and netrc.exists():
        has_key = "api.wandb.ai" in netrc.read_text(errors="ignore")
    if not has_key:
        return "offline"
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=2).close()
    except OSError:
        return "offline"
    return "online"


ID_FILE = "wandb_run_id"  # the run folder's wandb run id, so a resumed run continues the same wandb run
STEP_KEY = "trainer/step"


class WandbLogger:
    """wandb run in ``run_dir`` (offline when there is no key or network: sync later with ``wandb sync``).

    Every ``log`` call is its own wandb row (wandb's own step counts rows); the trainer's step goes into the row as
    ``trainer/step``, the x-axis of every metric, and the warm start's ``sft/*`` metrics are plotted over their own
    ``sft/step``, so the warm-start steps and the two step-0 validations (untrained, after the warm start) are kept
    as separate points instead of being merged into one row. ``resume``: continue the wandb run whose id the run
    folder holds (``wandb_run_id``, written when the run started) instead of starting a new one.
    """

    def __init__(self, project: str, experiment: str, run_dir: str | Path, config: dict[str, Any],
                 resume: bool = False) -> None:
        import wandb

        self.mode = wandb_mode()
        id_file = Path(run_dir) / ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        if run_id is None:
            run_id = uuid.uuid4().hex[:12]
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n")
        # wandb records the command line (sys.argv, read at init) and, by default, a copy of the console: the
        # first gets redacted, the second is off (train.log, redacted, is the run's output record)
        argv, sys.argv = sys.argv, [redact_text(a) for a in sys.argv]
        try:
            self._run = wandb.init(project=project, name=experiment, dir=str(run_dir), config=config, mode=self.mode,
                                   id=run_id, resume="allow", reinit=True, settings=wandb.Settings(console="off"))
        finally:
            sys.argv = argv
        self.run_id = run_id
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("sft/step")
        self._run.define_metric("sft/*", step_metric="sft/step")
        self._run.define_metric("*", step_metric=STEP_KEY)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log({**metrics, STEP_KEY: float(step)})

    def finish(self) -> None:
        self._run.finish()


class Tracker:
    """Fans each step's metrics out to the selected loggers (``console``, ``jsonl``, ``wandb``)."""

    def __init__(
        self,
        loggers: list[str] | tuple[str, ...],
        run_dir: str | Path,
        *,
        project: str = "ragen",
        experiment: str = "run",
        config: dict[str, Any] | None = None,
        append: bool = True,
        resume: bool = False,
    ) -> None:
        unknown = sorted(set(loggers) - set(KNOWN_LOGGERS))
        if unknown:
            raise ValueError(f"unknown logger(s) {unknown} in trainer.loggers; choose from {list(KNOWN_LOGGERS)}")
        self.run_dir = Path(run_dir)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        self._loggers: list[Logger] = []
        if "console" in loggers:
            self._loggers.append(ConsoleLogger())
        if "jsonl" in loggers:
            self._loggers.append(JsonlLogger(self.jsonl_path, append=append))
        if "wandb" in loggers:
            self._loggers.append(WandbLogger(redact_text(project), redact_text(experiment), self.run_dir,
                                             redact(config or {}), resume=resume))

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {redact_text(k): float(v) for k, v in metrics.items()}  # names may embed env text
        for logger in self._loggers:
            logger.log(clean, step)

    def finish(self) -> None:
        for logger in self._loggers:
            logger.finish()


def write_jsonl(path: str | Path, records: list[dict], append: bool = False) -> Path:
    """Write (or ``append``) ``records`` as JSON lines, secrets redacted (``ragen.utils.redaction``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(redact(rec)) + "\n")
    return path
