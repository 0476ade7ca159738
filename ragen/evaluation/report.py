"""Metrics of evaluated episodes, the two-model comparison, the console table and the JSON report.

Per env and model (:func:`summarize`), each with a 95% interval (``ragen.evaluation.stats``):

* ``success``: share of episodes the env reported as solved; Wilson interval over episodes;
* ``reward``: mean episode reward (sum of turn rewards, format penalties included); normal interval;
* ``format``: share of turns whose response parsed; Wilson interval over turns (turns of one episode are
  correlated, so for multi-turn envs this interval is somewhat optimistic);
* ``turns``: mean turns per episode; normal interval.

Two models (:func:`compare`, model 2 - model 1): rates by Newcombe's hybrid score interval for two independent
proportions (conservative here, since the seeds are shared; the format rate is over turns, which do not pair up),
means by the paired normal interval over per-episode differences (episode i is the same seed for both models).
The table is printed from the report dict, so the console and the JSON always show the same numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen.evaluation.runner import EpisodeResult
from ragen.evaluation.stats import (
    Z95,
    Interval,
    mean_interval,
    newcombe_difference,
    paired_difference,
    sample_std,
    wilson_interval,
)
from ragen.utils.redaction import redact

METRICS = ("success", "reward", "format", "turns")
LABELS = {"success": "success rate", "reward": "mean reward", "format": "format rate", "turns": "mean turns"}
METHODS = {
    "success": "Wilson score interval over episodes",
    "reward": "normal interval mean +- 1.96 s/sqrt(n) over episodes",
    "format": "Wilson score interval over turns",
    "turns": "normal interval mean +- 1.96 s/sqrt(n) over episodes",
    "difference_rates": "Newcombe (1998) hybrid score interval for p2 - p1 of independent proportions (method 10)",
    "difference_means": "paired normal interval of the mean per-episode difference (model 2 - model 1, same seeds)",
}


def _entry(interval: Interval, **extra: Any) -> dict[str, Any]:
    return {"estimate": interval.estimate, "low": interval.low, "high": interval.high, **extra}


def summarize(episodes: Sequence[EpisodeResult]) -> dict[str, Any]:
    """``{"n", "failed", "success", "reward", "format", "turns"}`` of one model on one env (module docstring)."""
    n = len(episodes)
    wins = sum(e.success for e in episodes)
    rewards = [e.reward for e in episodes]
    turns = [float(e.turns) for e in episodes]
    total_turns, parsed = sum(e.turns for e in episodes), sum(e.format_ok for e in episodes)
    return {
        "n": n,
        "failed": sum(e.failed for e in episodes),
        "success": _entry(wilson_interval(wins, n), successes=wins, trials=n),
        "reward": _entry(mean_interval(rewards), std=sample_std(rewards)),
        "format": _entry(wilson_interval(parsed, total_turns), successes=parsed, trials=total_turns),
        "turns": _entry(mean_interval(turns), std=sample_std(turns)),
    }


def compare(first: Sequence[EpisodeResult], second: Sequence[EpisodeResult]) -> dict[str, Any]:
    """Model 2 - model 1 for each metric, with its 95% interval (module docstring). Both lists must hold the same
    seeds in the same order: the paired intervals pair episode i of one model with episode i of the other."""
    seeds_1, seeds_2 = [e.seed for e in first], [e.seed for e in second]
    if seeds_1 != seeds_2:
        raise ValueError("the two models were not evaluated on the same seeds; cannot pair their episodes")
    return {
        "success": _entry(newcombe_difference(sum(e.success for e in first), len(first),
                                              sum(e.success for e in second), len(second))),
        "reward": _entry(paired_difference([e.reward for e in first], [e.reward for e in second])),
        "format": _entry(newcombe_difference(sum(e.format_ok for e in first), sum(e.turns for e in first),
                                             sum(e.format_ok for e in second), sum(e.turns for e in second))),
        "turns": _entry(paired_difference([float(e.turns) for e in first], [float(e.turns) for e in second])),
    }


def env_report(env: dict[str, Any], per_model: Sequence[Sequence[EpisodeResult]]) -> dict[str, Any]:
    """The report of one env: settings, seeds, per-model metrics, the difference (two models) and every episode."""
    seeds = [e.seed for e in per_model[0]]
    return {
        "env": env,
        "n": len(seeds),
        "seeds": seeds,
        "models": [summarize(eps) for eps in per_model],
        "difference": compare(per_model[0], per_model[1]) if len(per_model) == 2 else None,
        "episodes": [[e.to_dict() for e in eps] for eps in per_model],
    }


def build_report(models: list[dict[str, Any]], envs: dict[str, dict[str, Any]], **settings: Any) -> dict[str, Any]:
    """The whole report: ``models`` (resolved model arguments), ``settings`` (config name, overrides, n,
    temperature, ...), the interval methods, and ``envs`` (name -> :func:`env_report`)."""
    return {"models": models, **settings, "confidence": 0.95, "z": Z95, "methods": METHODS, "envs": envs}


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(report: dict[str, Any], path: str | Path) -> Path:
    """Write ``report`` as strict JSON (undefined numbers as null) to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact(_finite(report)), indent=2, allow_nan=False) + "\n")
    return path


def _cell(entry: dict[str, Any] | None, signed: bool = False) -> str:
    """``0.800 [0.490, 0.943]``; ``n/a`` for undefined numbers."""
    if entry is None:
        return ""

    def num(x: float) -> str:
        if x is None or not math.isfinite(x):
            return "n/a"
        return f"{x:+.3f}" if signed else f"{x:.3f}"

    return f"{num(entry['estimate'])} [{num(entry['low'])}, {num(entry['high'])}]"


def format_table(report: dict[str, Any]) -> str:
    """The console table: a legend of the models, then one row per env x metric with a column per model and,
    for two models, the difference (model 2 - model 1); every cell is ``estimate [95% interval]``."""
    models = report["models"]
    lines = [f"model {i + 1}: {m['label']}" + (f"  ({m['path']}, step {m['step']})" if m.get("step") is not None
                                               else "") for i, m in enumerate(models)]
    first_seed, n = report["val_seed"], report["n"]
    lines.append(f"{n} episodes per env on seeds {first_seed}..{first_seed + n - 1} (rollout.val_seed + i), "
                 f"temperature {report['temperature']:g}; "
                 "95% intervals (rates: Wilson; means: mean +- 1.96 s/sqrt(n)"
                 + ("; differences: Newcombe for rates, paired over seeds for means)" if len(models) == 2 else ")"))
    header = ["env", "metric"] + [f"model {i + 1}" for i in range(len(models))]
    header += ["model 2 - model 1"] if len(models) == 2 else []
    rows = [header]
    for name, env in report["envs"].items():
        for metric in METRICS:
            row = [name, LABELS[metric]] + [_cell(m[metric]) for m in env["models"]]
            if env["difference"] is not None:
                row.append(_cell(env["difference"][metric], signed=True))
            rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    table.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + [""] + table)
