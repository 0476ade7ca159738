"""Learning-curve PNGs from a metrics JSONL (matplotlib with the headless Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def default_curve_keys(records: list[dict[str, Any]]) -> list[str]:
    """The metrics worth a panel: env success/reward (train and val), actor/critic losses, KL and entropy."""
    keys = sorted({k for r in records for k in r if k != "step"})
    wanted = []
    for k in keys:
        leaf = k.rsplit("/", 1)[-1]
        if k.startswith(("env/", "val/")) and leaf in ("success", "reward", "episode_reward"):
            wanted.append(k)
        elif k in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "critic/vf_loss", "critic/value_loss"):
            wanted.append(k)
        elif k in ("reward/mean", "rollout/reward_mean"):
            wanted.append(k)
    return wanted


def plot_learning_curves(
    records: list[dict[str, Any]], path: str | Path, keys: list[str] | None = None, title: str = ""
) -> Path:
    """Save one panel per metric key (x = step) to ``path``; returns the path.

    Records without a key or with a non-finite value are skipped for that panel; with no plottable key
    at all, a single empty panel says so (the file is always written).
    """
    keys = keys if keys is not None else default_curve_keys(records)
    keys = [k for k in keys if any(_finite(r.get(k)) for r in records)]
    n = max(1, len(keys))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    if not keys:
        axes[0][0].text(0.5, 0.5, "no metrics to plot", ha="center", va="center")
    for ax, key in zip(axes.flat, keys, strict=False):
        pts = [(r["step"], float(r[key])) for r in records if _finite(r.get(key))]
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, linewidth=1.5)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        plain_axes(ax)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plain_axes(ax: Any) -> None:
    """Ticks at whole steps only, and y labels that read as values: matplotlib's default would label a nearly flat
    curve (an entropy of 10.790120 +- 1e-6) with an offset such as ``1e-6+1.079012e1`` over ticks 0.5, 1.0..."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
