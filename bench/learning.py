"""The headline number: minutes until a launch script's default run reaches validation success >= 0.8.

    python bench/learning.py                              # train_ppo.sh's default run (config ppo_bandit), seeds 0 1 2
    python bench/learning.py --seeds 0 1 2 --config ppo_bandit trainer.total_steps=16   # extra args: Hydra overrides

Each seed is a whole ``python -m ragen.train --config-name <config> trainer.seed=<s>`` process in a fresh output
folder, so the clock includes everything a user waits for: start-up, model load, warm start, rollouts, updates and
validations. The time of a validation is when its record appears in ``metrics.jsonl`` (polled every second); the
success is the mean over the run's validation envs of ``val/env/<name>/success``. A seed that never reaches the
threshold counts as its whole run time and is flagged (the mean is then a lower bound).
Also printed: trained tokens per second (all real tokens of the training batches / the sum of ``timing/step``)
and each seed's peak ``memory/total_peak_gb``. Runs are sequential: on a 2-core machine parallel seeds would
share the cores and lengthen each other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SeedRun:
    """One seed's outcome: ``curve`` holds (minutes since launch, validation success) per validation."""

    seed: int
    curve: list[tuple[float, float]] = field(default_factory=list)
    minutes: float = 0.0
    tokens: float = 0.0
    step_seconds: float = 0.0
    peak_gb: float = 0.0
    exit_code: int = 0

    def time_to(self, threshold: float) -> float | None:
        return next((m for m, s in self.curve if s >= threshold), None)


def val_success(record: dict) -> float | None:
    """Mean of ``val/env/<name>/success`` over the record's envs (None: not a validation record)."""
    vals = [v for k, v in record.items() if k.startswith("val/env/") and k.endswith("/success")]
    return sum(vals) / len(vals) if vals else None


def run_seed(seed: int, config: str, overrides: list[str], out: Path, stream) -> SeedRun:
    """Run one seed to completion, stamping each validation record as it appears."""
    cmd = [sys.executable, "-m", "ragen.train", "--config-name", config, f"trainer.seed={seed}",
           f"trainer.output_dir={out}", "trainer.progress_bar=false", "trainer.resume=none", *overrides]
    res, seen, start = SeedRun(seed), 0, time.perf_counter()
    metrics = out / "metrics.jsonl"
    with open(out.parent / f"seed{seed}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            done = proc.poll() is not None
            lines = metrics.read_text().splitlines() if metrics.is_file() else []
            for line in lines[seen:]:
                if not line.strip():
                    continue
                rec = json.loads(line)
                now = (time.perf_counter() - start) / 60
                success = val_success(rec)
                if success is not None:
                    res.curve.append((now, success))
                    print(f"  seed {seed}: step {rec.get('step')}, {now:5.1f} min, val success {success:.3f}",
                          file=stream, flush=True)
                if "timing/step" in rec:
                    res.tokens += rec.get("perf/total_tokens", 0.0)
                    res.step_seconds += rec["timing/step"]
                peaks = [v for k, v in rec.items() if k.startswith("memory/") and k.endswith("_peak_gb")
                         and k != "memory/total_peak_gb"]  # in-process runs log only the driver's
                res.peak_gb = max(res.peak_gb, rec.get("memory/total_peak_gb", sum(peaks)))
            seen = len(lines)
            if done:
                break
            time.sleep(1.0)
    res.minutes, res.exit_code = (time.perf_counter() - start) / 60, proc.returncode
    return res


def mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="ppo_bandit", help="Hydra config name (ppo_bandit = train_ppo.sh)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--out", default=None, help="folder for the runs (default: a temporary folder)")
    args, overrides = p.parse_known_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="ragen_learning_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"config {args.config}, seeds {args.seeds}, threshold {args.threshold}, runs in {root}", flush=True)
    runs = [run_seed(s, args.config, overrides, root / f"seed{s}", sys.stdout) for s in args.seeds]
    print(f"\n{'seed':>4} {'exit':>4} {'first val':>9} {'best val':>8} {'to >= thr':>10} {'run min':>8} "
          f"{'tokens/s':>9} {'peak GB':>8}")
    for r in runs:
        t = r.time_to(args.threshold)
        first = r.curve[0][1] if r.curve else float("nan")
        best = max((s for _, s in r.curve), default=float("nan"))
        tps = r.tokens / r.step_seconds if r.step_seconds else float("nan")
        reach = f"{t:.1f}" if t is not None else "never"
        print(f"{r.seed:>4} {r.exit_code:>4} {first:>9.3f} {best:>8.3f} {reach:>10} "
              f"{r.minutes:>8.1f} {tps:>9.0f} {r.peak_gb:>8.2f}")
    reached = [r.time_to(args.threshold) for r in runs]
    times = [t if t is not None else r.minutes for t, r in zip(reached, runs, strict=True)]
    never = sum(t is None for t in reached)
    tps = [r.tokens / r.step_seconds for r in runs if r.step_seconds]
    print(f"\ntime to validation success >= {args.threshold}: {mean_std(times)} min over {len(runs)} seeds"
          + (f" ({never} never reached it: counted as their whole run, so a lower bound)" if never else ""))
    if tps:
        print(f"trained tokens per second: {mean_std(tps)} (real tokens of the training batches / step time)")
    if any(r.exit_code for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
