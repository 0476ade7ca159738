"""Tables of ``bench/peers/trl_grpo.py``: step-time figures, the phase profile, time to success, and the markdown
block for ``docs/benchmarks.md``. Pure functions of the runs' records (no torch, no ragen)."""

from __future__ import annotations

import datetime
import platform
import statistics
import subprocess
from dataclasses import dataclass, field

# Phases of a step, in print order: (key in a side's phase record, label). ragen's come from its ``timing/*``
# metrics (rollout split into the engine's generation and the rest), TRL's from the bench's wrappers.
RAGEN_PHASES = (("generate", "generation (engine)"), ("rollout_other", "rollout: env, parse, collate"),
                ("old_log_probs", "old log-probs (no grad)"), ("advantages", "advantages"),
                ("actor_update", "loss + backward + optimizer"), ("weight_sync", "weights to the engine"),
                ("report_samples", "report samples"), ("other", "other"))
TRL_PHASES = (("generate", "generation (model.generate)"), ("score", "rewards, advantages"),
              ("loss_backward", "loss + backward"), ("optimizer", "optimizer"), ("other", "clip, logging, other"))


@dataclass
class SideRun:
    """One side's speed run: per-step seconds, tokens and phases (warm-up steps included, first)."""

    name: str
    seconds: list[float] = field(default_factory=list)
    prompt_tokens: list[float] = field(default_factory=list)
    completion_tokens: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)
    peak_rss_gb: float = 0.0
    exit_code: int = 0
    wall_min: float = 0.0

    def timed(self, warmup: int) -> SideRun:
        """The same run without its first ``warmup`` steps."""
        return SideRun(self.name, self.seconds[warmup:], self.prompt_tokens[warmup:], self.completion_tokens[warmup:],
                       self.phases[warmup:], self.peak_rss_gb, self.exit_code, self.wall_min)

    def figures(self) -> dict[str, float]:
        """min / median / max s per step, median tokens per step, tokens per second of step time, peak RSS."""
        if not self.seconds:
            return {}
        total = sum(self.seconds)
        return {"min": min(self.seconds), "median": statistics.median(self.seconds), "max": max(self.seconds),
                "tokens": statistics.median(p + c for p, c in zip(self.prompt_tokens, self.completion_tokens,
                                                                  strict=True)),
                "completion": statistics.median(self.completion_tokens),
                "completion_per_s": sum(self.completion_tokens) / total,
                "total_per_s": (sum(self.prompt_tokens) + sum(self.completion_tokens)) / total,
                "rss": self.peak_rss_gb}


@dataclass
class LearnRun:
    """One side and seed of ``--learn``: (step, wall minutes since launch, validation success) per validation."""

    name: str
    seed: int
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    cap: int = 0
    warm_start_min: float = 0.0
    wall_min: float = 0.0
    exit_code: int = 0

    def reached(self, threshold: float) -> tuple[int, float] | None:
        return next(((s, m) for s, m, v in self.curve if v >= threshold), None)


def machine() -> dict[str, str]:
    """CPU model name, logical cores, and whether the CPU has native bf16 (avx512_bf16)."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        lscpu = ""
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                 platform.processor() or "unknown")
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        flags = ""
    import os

    return {"cpu": model, "cores": str(os.cpu_count()), "avx512_bf16": "yes" if "avx512_bf16" in flags else "no",
            "date": datetime.date.today().isoformat()}


def speed_table(runs: list[SideRun], warmup: int) -> list[str]:
    """Per side: s/step, tokens, tokens/s, peak RSS; and ragen's ratios against each peer."""
    lines = [f"| side | s/step min / median / max (after {warmup} warm-up) | tokens/step (prompt+completion) | "
             "completion tokens/step | completion tokens/s | all tokens/s | peak RSS GB |",
             "|---|---|---|---|---|---|---|"]
    figs = {r.name: r.timed(warmup).figures() for r in runs}
    for r in runs:
        f = figs[r.name]
        if not f:
            lines.append(f"| {r.name} | (no timed step; exit {r.exit_code}) | | | | | {r.peak_rss_gb:.2f} |")
            continue
        lines.append(f"| {r.name} | {f['min']:.1f} / {f['median']:.1f} / {f['max']:.1f} | {f['tokens']:.0f} | "
                     f"{f['completion']:.0f} | {f['completion_per_s']:.1f} | {f['total_per_s']:.0f} | {f['rss']:.2f} |")
    base = figs.get("ragen")
    peers = [r.name for r in runs if r.name != "ragen" and figs[r.name]]
    if base and peers:
        lines += ["", "| ragen / peer | step time (peer s / ragen s) | completion tokens/s | all tokens/s | "
                  "peak RSS (ragen / peer) |", "|---|---|---|---|---|"]
        for name in peers:
            p = figs[name]
            lines.append(f"| ragen / {name} | {p['median'] / base['median']:.2f}x | "
                         f"{base['completion_per_s'] / p['completion_per_s']:.2f}x | "
                         f"{base['total_per_s'] / p['total_per_s']:.2f}x | {base['rss'] / p['rss']:.2f} |")
    return lines


def profile_table(runs: list[SideRun], warmup: int) -> list[str]:
    """Median seconds per phase and its share of the median step, per side."""
    lines = []
    for r in runs:
        t = r.timed(warmup)
        if not t.phases:
            continue
        spec = RAGEN_PHASES if r.name == "ragen" else TRL_PHASES
        step = statistics.median(t.seconds)
        lines += ["", f"{r.name}: median step {step:.1f} s", "| phase | s (median) | share |", "|---|---|---|"]
        for key, label in spec:
            vals = [p.get(key, 0.0) for p in t.phases]
            med = statistics.median(vals)
            if med or key != "report_samples":
                lines.append(f"| {label} | {med:.2f} | {med / step:.0%} |")
    return lines


def learn_table(runs: list[LearnRun], threshold: float) -> list[str]:
    """Per side and seed: minutes (and step) to validation success >= threshold, or 'not reached'."""
    lines = [f"| side | seed | to success >= {threshold:g}: wall min (step) | best val | run min | warm start min |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        hit = r.reached(threshold)
        reach = f"{hit[1]:.1f} (step {hit[0]})" if hit else f"not reached (cap {r.cap} steps)"
        best = max((v for _, _, v in r.curve), default=float("nan"))
        lines.append(f"| {r.name} | {r.seed} | {reach} | {best:.3f} | {r.wall_min:.1f} | {r.warm_start_min:.1f} |")
    by_side: dict[str, list[LearnRun]] = {}
    for r in runs:
        by_side.setdefault(r.name, []).append(r)
    lines.append("")
    for name, rs in by_side.items():
        hits = [h[1] for h in (r.reached(threshold) for r in rs) if h]
        med = f"median {statistics.median(hits):.1f} min over the {len(hits)} that reached it" if hits else "none"
        lines.append(f"- {name}: reached in {len(hits)} of {len(rs)} seeds; {med}")
    return lines


def markdown(command: str, info: dict[str, str], versions: dict[str, str], body: list[str],
             notes: list[str]) -> str:
    """The block to paste into ``docs/benchmarks.md``."""
    head = [f"Measured {info['date']} on {info['cpu']}, {info['cores']} logical cores, avx512_bf16: "
            f"{info['avx512_bf16']}; " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", "",
            f"    {command}", ""]
    return "\n".join(head + body + [""] + [f"- {n}" for n in notes])
