"""Build the run report from the files of a run folder: ``report/index.html`` and one ``report/step_N.html`` per step.

Reads only files (so ``python -m ragen.report RUN_DIR`` and the trainer produce the same pages): ``metrics.jsonl``
(curves, timing), ``config.json``, ``val_rollouts/step_N.jsonl`` (validation episodes) and
``train_samples/step_N.jsonl`` (the sampled training episodes). Pages are self-contained: inline CSS, SVG and a
few lines of JavaScript, no network. They hold no timestamps, so a rebuild writes identical bytes.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

from ragen.report.episodes import FILTER_JS, step_page_body
from ragen.report.records import read_records
from ragen.report.svg import Series, line_chart

STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0 auto; max-width: 1320px;
       padding: 12px 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 17px; margin: 22px 0 6px; border-bottom: 1px solid #ddd; }
code, pre, .seq { font-family: ui-monospace, 'DejaVu Sans Mono', Menlo, monospace; font-size: 12.5px; }
table { border-collapse: collapse; margin: 6px 0; } td, th { padding: 2px 10px; border-bottom: 1px solid #eee;
  text-align: left; vertical-align: top; } th { background: #f4f4f4; } td.n { text-align: right; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; } .chart { border: 1px solid #e4e4e4; background: #fcfcfc; }
.ct { font-size: 12.5px; font-weight: 600; fill: #333; } .cl { font-size: 10.5px; fill: #555; }
.grid { stroke: #e8e8e8; } .frame { fill: none; stroke: #bbb; }
.bar { display: inline-block; height: 10px; background: #4a7bb7; vertical-align: middle; }
.legend .bar { width: 180px; height: 12px; margin: 0 6px; border: 1px solid #ccc; }
.note { color: #666; margin: 2px 0 6px; } .muted { color: #888; }
.filters { margin: 8px 0; position: sticky; top: 0; background: #fff; padding: 6px 0; z-index: 2;
           border-bottom: 1px solid #eee; }
.fb { margin-right: 6px; padding: 3px 12px; border: 1px solid #999; border-radius: 4px; background: #f6f6f6;
      cursor: pointer; } .fb.on { background: #333; color: #fff; }
.ep { border: 1px solid #ddd; border-radius: 6px; margin: 10px 0; padding: 8px 12px; }
.eh { font-weight: 600; margin-bottom: 4px; } .eh a { color: #555; text-decoration: none; }
.ok { color: #1a7f37; } .bad { color: #b42318; } .flag { background: #fff3cd; padding: 0 4px; border-radius: 3px; }
.err { color: #b42318; white-space: pre-wrap; }
.turns td, .turns th { font-size: 12.5px; padding: 1px 8px; }
.seq { white-space: pre-wrap; word-break: break-word; margin: 6px 0; padding: 6px; background: #fafafa;
       border-left: 3px solid #ddd; }
.e { color: #9a9a9a; } .plain { color: #222; }
.m { border-radius: 2px; box-shadow: inset -1px 0 0 rgba(0, 0, 0, .14); }
.rw { display: inline-block; margin: 0 4px; padding: 0 5px; border-radius: 8px; background: #333; color: #fff;
      font-size: 11px; font-family: system-ui, sans-serif; }
details.prompt summary { color: #888; cursor: pointer; font-family: system-ui, sans-serif; font-size: 12px; }
details.cfg { margin: 2px 0; } details.cfg summary { cursor: pointer; font-weight: 600; }
"""


def page(title: str, body: str, script: str = "") -> str:
    """A complete self-contained HTML document."""
    js = f"<script>{script}</script>" if script else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style>{js}</head><body>{body}</body></html>\n")


def report_steps(run_dir: Path) -> list[int]:
    """Steps with validation episodes or training samples saved, ascending."""
    steps = set()
    for sub in ("val_rollouts", "train_samples"):
        folder = run_dir / sub
        if folder.is_dir():
            steps |= {int(m.group(1)) for f in folder.iterdir() if (m := STEP_FILE.match(f.name))}
    return sorted(steps)


def pending_steps(run_dir: Path, current: int) -> list[int]:
    """What the trainer rewrites at a validation: ``current`` (the step just validated) and every step whose page is
    missing or older than its saved episodes (steps trained since the last validation, and steps redone after a
    resume)."""
    run_dir = Path(run_dir)

    def stale(step: int) -> bool:
        page = run_dir / "report" / f"step_{step}.html"
        if step == current or not page.exists():
            return True
        sources = (run_dir / sub / f"step_{step}.jsonl" for sub in ("val_rollouts", "train_samples"))
        return any(f.exists() and f.stat().st_mtime_ns > page.stat().st_mtime_ns for f in sources)

    return [s for s in report_steps(run_dir) if stale(s)]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _series(records: list[dict[str, Any]], key: str, name: str | None = None) -> Series:
    """The finite values of ``key`` over steps; validation series are drawn dashed."""
    points = [(float(r["step"]), float(r[key])) for r in records if _finite(r.get(key))]
    return Series(name or key, points, dashed=key.startswith("val/"))


def env_names(records: list[dict[str, Any]]) -> list[str]:
    """Env names that appear in ``env/<name>/...`` or ``val/env/<name>/...`` metrics."""
    names = set()
    for r in records:
        for k in r:
            parts = k.split("/")
            if len(parts) == 3 and parts[0] == "env":
                names.add(parts[1])
            elif len(parts) == 4 and parts[:2] == ["val", "env"]:
                names.add(parts[2])
    return sorted(names)


def chart_specs(records: list[dict[str, Any]]) -> list[tuple[str, list[Series]]]:
    """(title, series) of every chart: per env success / format / turns (train and validation), rewards, lengths,
    losses, the critic's numbers and the template-collapse metrics (``collapse/*``, docs/collapse.md). Charts
    without any data are dropped."""
    specs = []
    for env in env_names(records):
        for leaf, label in (("success", "success"), ("format_ok", "format ok"), ("turns", "turns per episode")):
            specs.append((f"{env}: {label}", [_series(records, f"env/{env}/{leaf}", "train"),
                                              _series(records, f"val/env/{env}/{leaf}", "validation")]))
    specs += [
        ("episode reward", [_series(records, "reward/mean", "train mean"),
                            _series(records, "val/reward/mean", "validation mean")]),
        ("length (tokens)", [_series(records, "rollout/response_tokens_mean", "model tokens / episode"),
                             _series(records, "rollout/seq_len_mean", "sequence")]),
        ("actor loss", [_series(records, "actor/pg_loss", "pg_loss"), _series(records, "actor/loss", "loss")]),
        ("critic loss", [_series(records, "critic/vf_loss", "vf_loss")]),
        ("actor entropy / KL", [_series(records, "actor/entropy", "entropy"),
                                _series(records, "actor/ppo_kl", "ppo_kl")]),
        ("advantages (model tokens)", [_series(records, f"critic/advantages/{s}", s) for s in ("max", "mean", "min")]),
        ("values and returns", [_series(records, "critic/values/mean", "values mean"),
                                _series(records, "critic/returns/mean", "returns mean")]),
        ("critic explained variance", [_series(records, "critic/vf_explained_var", "explained var")]),
        ("warm start", [_series(records, "sft/nll", "nll")]),
        ("template collapse: prompt-response MI (nats)", [_series(records, "collapse/mi", "mi"),
                                                          _series(records, "collapse/mi_bound", "log N (most)")]),
        ("template collapse: retrieval accuracy", [_series(records, "collapse/retrieval_acc", "retrieval acc"),
                                                   _series(records, "collapse/chance_acc", "chance (1/N)")]),
    ]
    return [(t, s) for t, s in specs if any(x.points for x in s)]


def timing_table(records: list[dict[str, Any]]) -> str:
    """Per ``timing/*`` key: records, mean, last and total seconds, and its share of all phases' total."""
    keys = sorted({k for r in records for k in r if k.startswith("timing/")})
    rows = []
    for k in keys:
        vals = [float(r[k]) for r in records if _finite(r.get(k))]
        if vals:
            rows.append((k[len("timing/"):], len(vals), sum(vals) / len(vals), vals[-1], sum(vals)))
    if not rows:
        return "<p class='note'>no timing/* metrics</p>"
    phase_total = sum(r[4] for r in rows if r[0] != "step") or 1.0
    rows.sort(key=lambda r: -r[4])
    body = []
    for name, n, mean, last, total in rows:
        share = "" if name == "step" else f"{100 * total / phase_total:.1f}%"
        width = 0 if name == "step" else round(160 * total / phase_total)
        body.append(f"<tr><td>{html.escape(name)}</td><td class='n'>{n}</td><td class='n'>{mean:.3f}</td>"
                    f"<td class='n'>{last:.3f}</td><td class='n'>{total:.1f}</td><td class='n'>{share}</td>"
                    f"<td><span class='bar' style='width:{width}px'></span></td></tr>")
    return ("<table><tr><th>phase</th><th>records</th><th>mean s</th><th>last s</th><th>total s</th>"
            "<th>share</th><th></th></tr>" + "".join(body) + "</table><p class='note'>share: of the summed phase "
            "times (timing/step is the whole RL step; validation, warm start and report run outside it; "
            "timing/report at step N is the report written at the previous validation)</p>")


def config_html(config: dict[str, Any]) -> str:
    """The run config, one foldable table per section (algorithm, env, model and trainer open)."""
    if not config:
        return "<p class='note'>no config.json</p>"
    out = []
    for section, values in config.items():
        if not isinstance(values, dict):
            values = {"": values}
        opened = " open" if section in ("algorithm", "env", "model", "trainer") else ""
        rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td><code>{html.escape(json.dumps(v, default=str))}"
                       f"</code></td></tr>" for k, v in values.items())
        out.append(f'<details class="cfg"{opened}><summary>{html.escape(str(section))}</summary>'
                   f"<table>{rows}</table></details>")
    return "".join(out)


def _step_row(run_dir: Path, step: int) -> str:
    val = read_records(run_dir / "val_rollouts" / f"step_{step}.jsonl")
    train = read_records(run_dir / "train_samples" / f"step_{step}.jsonl")
    wins = sum(bool(r.get("success")) for r in val)
    rate = f"{wins / len(val):.2f}" if val else ""
    reward = (f"{sum(sum(t.get('reward', 0.0) for t in r.get('turns', [])) for r in val) / len(val):+.3f}"
              if val else "")
    return (f"<tr><td><a href='step_{step}.html'>step {step}</a></td><td class='n'>{len(val)}</td>"
            f"<td class='n'>{rate}</td><td class='n'>{reward}</td><td class='n'>{len(train)}</td></tr>")


def index_body(run_dir: Path, records: list[dict[str, Any]], config: dict[str, Any], steps: list[int]) -> str:
    name = config.get("trainer", {}).get("experiment_name") or run_dir.name
    alg = config.get("algorithm", {})
    env = config.get("env", {})
    head = (f"<h1>{html.escape(str(name))}</h1><p class='note'>env {html.escape(str(env.get('name', '?')))} · "
            f"estimator {html.escape(str(alg.get('estimator', '?')))} · {len(records)} metric records · "
            f"{len(steps)} step page(s)</p>")
    charts = "".join(line_chart(t, s) for t, s in chart_specs(records)) or "<p class='note'>no metrics yet</p>"
    pages = ("<table><tr><th>page</th><th>val episodes</th><th>val success</th><th>val reward</th>"
             "<th>train samples</th></tr>" + "".join(_step_row(run_dir, s) for s in steps) + "</table>"
             if steps else "<p class='note'>no validation or training samples saved yet</p>")
    return (head + f"<h2>Steps</h2>{pages}<h2>Learning curves</h2><p class='note'>x: step; dashed: validation</p>"
            f"<div class='charts'>{charts}</div><h2>Timing per phase</h2>{timing_table(records)}"
            f"<h2>Config</h2>{config_html(config)}")


def build_report(run_dir: str | Path, steps: list[int] | None = None,
                 records: list[dict[str, Any]] | None = None) -> Path:
    """Write ``report/index.html`` and the step pages of ``steps`` (None = every step with saved episodes);
    ``records``: the metric records (None = read ``metrics.jsonl``). Returns the index path."""
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    if records is None:
        records = read_records(run_dir / "metrics.jsonl")
    cfg_path = run_dir / "config.json"
    config = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    all_steps = report_steps(run_dir)
    name = str(config.get("trainer", {}).get("experiment_name") or run_dir.name)
    for step in all_steps if steps is None else [s for s in steps if s in all_steps]:
        val = read_records(run_dir / "val_rollouts" / f"step_{step}.jsonl")
        train = read_records(run_dir / "train_samples" / f"step_{step}.jsonl")
        (out / f"step_{step}.html").write_text(page(f"{name} · step {step}", step_page_body(step, val, train),
                                                    FILTER_JS), encoding="utf-8")
    index = out / "index.html"
    index.write_text(page(f"{name} · run report", index_body(run_dir, records, config, all_steps)), encoding="utf-8")
    return index
