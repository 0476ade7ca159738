import math
import random
import time

import numpy as np
import pytest
import torch

from ragen.utils.plotting import default_curve_keys, plot_learning_curves
from ragen.utils.seeding import get_rng_state, seed_everything, set_rng_state
from ragen.utils.timing import timed
from ragen.utils.tracking import Tracker, format_table, read_jsonl, wandb_mode


def test_timed_accumulates_and_survives_errors():
    timings: dict[str, float] = {}
    with timed("a", timings):
        time.sleep(0.02)
    with timed("a", timings):
        time.sleep(0.02)
    with pytest.raises(RuntimeError):
        with timed("b", timings):
            raise RuntimeError("boom")
    assert 0.04 <= timings["a"] < 1.0
    assert "b" in timings and timings["b"] >= 0


def test_rng_state_roundtrip():
    seed_everything(3)
    state = get_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(2))
    set_rng_state(state)
    b = (random.random(), np.random.rand(), torch.rand(2))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_tracker_jsonl_and_console(tmp_path, capsys):
    tr = Tracker(["console", "jsonl"], tmp_path, append=False)
    tr.log({"actor/pg_loss": -0.5, "env/bandit/success": 0.25}, step=1)
    tr.log({"actor/pg_loss": -0.25, "env/bandit/success": 0.75}, step=2)
    tr.finish()
    recs = read_jsonl(tmp_path / "metrics.jsonl")
    assert recs == [
        {"step": 1, "actor/pg_loss": -0.5, "env/bandit/success": 0.25},
        {"step": 2, "actor/pg_loss": -0.25, "env/bandit/success": 0.75},
    ]
    out = capsys.readouterr().out
    assert "env/bandit/success" in out and "0.75" in out and "step 2" in out
    with pytest.raises(ValueError, match="trainer.loggers"):
        Tracker(["tensorboard"], tmp_path)


def test_format_table_values():
    text = format_table({"a/x": 1.0, "b/y": 0.123456, "c": float("nan")}, step=7)
    assert "step 7" in text and " 1 " in text + " " and "0.1235" in text and "nan" in text


def test_wandb_mode_offline_without_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"


def test_plot_learning_curves(tmp_path):
    recs = [
        {"step": i, "env/bandit/success": i / 10, "actor/pg_loss": math.sin(i), "timing/step": 1.0}
        for i in range(1, 6)
    ]
    recs.append({"step": 6, "val/env/bandit/success": 0.9})
    keys = default_curve_keys(recs)
    assert keys == ["actor/pg_loss", "env/bandit/success", "val/env/bandit/success"]
    out = plot_learning_curves(recs, tmp_path / "curve.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    empty = plot_learning_curves([], tmp_path / "empty.png")
    assert empty.read_bytes()[:4] == b"\x89PNG"


class _FakeRun:
    def __init__(self, kwargs):
        self.kwargs, self.rows, self.metrics = kwargs, [], {}

    def define_metric(self, name, step_metric=None):
        self.metrics[name] = step_metric

    def log(self, row, step=None):
        assert step is None  # wandb's own step counts rows: none is merged into another
        self.rows.append(dict(row))

    def finish(self):
        pass


def test_wandb_keeps_every_row_and_a_resumed_run_continues_its_wandb_run(monkeypatch, tmp_path):
    """Warm-start steps and both step-0 validations are logged at trainer step 0: each stays its own wandb row, with
    the trainer step as the x-axis (sft/* over sft/step); a resumed run continues the run folder's wandb run id."""
    import sys
    import types

    runs = []
    fake = types.SimpleNamespace(init=lambda **kw: runs.append(_FakeRun(kw)) or runs[-1], Settings=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "offline")
    t = Tracker(["wandb"], tmp_path, project="p", experiment="e", config={})
    for k in range(3):
        t.log({"sft/loss": 1.0 - k, "sft/step": k + 1.0}, 0)
    t.log({"val/success": 0.0}, 0)
    t.log({"val/success": 0.5, "val/after_warm_start": 1.0}, 0)
    t.log({"actor/loss": 0.1}, 1)
    t.finish()
    run = runs[0]
    assert len(run.rows) == 6 and [r["trainer/step"] for r in run.rows] == [0, 0, 0, 0, 0, 1]
    assert run.metrics == {"trainer/step": None, "sft/step": None, "sft/*": "sft/step", "*": "trainer/step"}
    first = run.kwargs["id"]
    assert len(first) == 12 and (tmp_path / "wandb_run_id").read_text().strip() == first
    Tracker(["wandb"], tmp_path, project="p", experiment="e", config={}, resume=True).finish()
    assert runs[1].kwargs["id"] == first and runs[1].kwargs["resume"] == "allow"
    Tracker(["wandb"], tmp_path, project="p", experiment="e", config={}).finish()  # a fresh start: a new run
    assert runs[2].kwargs["id"] != first


def test_curve_axes_show_values_at_whole_steps(tmp_path, monkeypatch):
    """A nearly flat entropy (10.790120 + 1e-6 * step): matplotlib's default labels the y axis with the offset
    '1e-6+1.079012e1' over ticks like 0, 1, 2 and puts x ticks every 0.25 step. The curve's axes show the values
    themselves (no offset text) and x ticks at whole steps only."""
    from ragen.utils import plotting

    figures = []
    close = plotting.plt.close
    monkeypatch.setattr(plotting.plt, "close", figures.append)  # keep the figure to inspect its axes
    recs = [{"step": s, "actor/entropy": 10.790120 + 1e-6 * s, "actor/pg_loss": 0.5 * s} for s in range(3)]
    plot_learning_curves(recs, tmp_path / "curve.png", keys=["actor/entropy", "actor/pg_loss"])
    (fig,) = figures
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.yaxis.get_major_formatter().get_offset() == ""
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels and not any("e" in label for label in labels), labels
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks == [0.0, 1.0, 2.0], ticks
    entropy = [float(t.get_text()) for t in fig.axes[0].get_yticklabels()]
    assert all(10.7901 < v < 10.7902 for v in entropy), entropy  # the values, not deviations from an offset
    close(fig)
