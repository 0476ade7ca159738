"""Asynchronous against synchronous training with a latency-bound env, in one run: wall time per trained sample,
the trainer's and the engine's idle fractions, and a timing model checked against the measurement.

Each setting is a real training run (``python -m ragen.train``, ``ppo_multi_turn`` with ``+preset=tiny``: the tiny
random model; the recipe's in-process workers, so the engine's thread and the update share one process; the hf
engine) on ``latency_lake`` (``bench/latency_env.py``:
FrozenLake 3x3 whose every continuing turn waits ``--delays`` seconds, a stand-in for a tool call). Both loops step
the batch's envs concurrently (``agent.env_workers``), so the async figure is the overlap of rollout and update
alone. Settings: ``sync`` (the synchronous loop, the engine hosted by the actor's rank) and ``async k=K``
(``trainer.async_rollout=true trainer.max_staleness=K``, the engine in the driver, ``token_tis`` correction), run in
turn per delay. The first ``--skip`` steps (start-up, the first rollout nothing overlaps) and the last step (it
waits for no batch in flight, since none is played past the run's end) are left out: the figures are the steady
state's.

Timing model: a synchronous step takes R + U (R: the rollout, U: the rest of the step: old log-probs, update,
weight sync, logging). With k >= 1 the rollout of the next batch overlaps the update, so a step takes max(R', U')
where R' and U' are the same phases while they share the machine; the model predicts (R + U) / max(R, U) from the
synchronous run's phases and the bench prints it beside the measured ratio (on 2 CPU cores R' > R and U' > U, since
the engine and the update share the cores; on GPUs with a separate engine they do not share compute).

Usage: python bench/async_rollout.py [--delays 0.5 2] [--steps 8] [--skip 2] [--ks 1 2] [--memory-steps 0]
(``--memory-steps 50``: one more async k=1 run of that many steps, whose driver and actor RSS per step must stay
level.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def overrides(out: Path, delay: float, steps: int, k: int | None) -> list[str]:
    """The run's Hydra overrides: ``k`` None = the synchronous loop."""
    base = ["+preset=tiny", "imports=[latency_env]", "env=latency_lake", f"env.config.delay_s={delay}",
            f"trainer.output_dir={out}", f"trainer.total_steps={steps}", "trainer.sft_warmup_steps=0",
            "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.save_freq=0", "trainer.report=false",
            "trainer.collapse_every=0", "rollout.n_groups=4", "rollout.group_size=2"]
    if k is None:
        return base
    return [*base, "trainer.async_rollout=true", f"trainer.max_staleness={k}",
            "algorithm.rollout_correction.mode=token_tis"]


def run(delay: float, steps: int, k: int | None) -> list[dict]:
    """One training run; returns its metric records."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT),
                                                            os.environ.get("PYTHONPATH", "")]),
               "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, "-m", "ragen.train", "--config-name", "ppo_multi_turn", *overrides(out, delay, steps, k)]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with (out / "metrics.jsonl").open() as fh:
            return [json.loads(line) for line in fh if line.strip()]


def summary(records: list[dict], skip: int) -> dict[str, float]:
    """Seconds per trained sample and per step, and the phase means of the steps after ``skip``."""
    steps = [r for r in records if "timing/step" in r][skip:-1]  # steady state: the last step plays nothing ahead
    n = len(steps)
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / n  # noqa: E731
    samples = sum(r["perf/episodes"] if "perf/episodes" in r else r.get("rollout/episodes", 8) for r in steps)
    step_s, rollout_s = mean("timing/step"), mean("timing/rollout")
    return {"per_sample": sum(r["timing/step"] for r in steps) / samples, "step": step_s, "rollout": rollout_s,
            "rest": step_s - rollout_s, "trainer_idle": mean("async/trainer_idle_frac") if "async/rollout_s" in steps[0]
            else rollout_s / step_s, "engine_idle": mean("async/engine_idle_frac") if "async/rollout_s" in steps[0]
            else 1 - rollout_s / step_s, "played": mean("async/rollout_s") if "async/rollout_s" in steps[0]
            else rollout_s, "staleness": mean("async/staleness_mean")}


def predicted(sync: dict[str, float]) -> float:
    """The timing model's async (k >= 1) speed-up from the synchronous run's phases: (R + U) / max(R, U)."""
    return (sync["rollout"] + sync["rest"]) / max(sync["rollout"], sync["rest"])


def memory_check(delay: float, steps: int) -> None:
    """RSS per step of each process of a long async k=1 run (the driver, and the Ray workers where the run has them):
    first and last of the second half, and the largest step-to-step growth there."""
    records = [r for r in run(delay, steps, 1) if "memory/driver_rss_gb" in r]
    half = records[len(records) // 2:]
    for proc in [p for p in ("driver", "actor", "critic") if f"memory/{p}_rss_gb" in half[0]]:
        rss = [r[f"memory/{proc}_rss_gb"] for r in half]
        growth = max(b - a for a, b in zip(rss, rss[1:], strict=False))
        print(f"memory {proc}: steps {half[0]['step']}-{half[-1]['step']} RSS {rss[0]:.3f} -> {rss[-1]:.3f} GB, "
              f"largest step-to-step growth {growth:+.3f} GB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delays", type=float, nargs="+", default=[0.5, 2.0], help="seconds per continuing turn")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--memory-steps", type=int, default=0)
    args = ap.parse_args()
    print(f"ppo_multi_turn +preset=tiny, latency_lake, 4 groups x 2, {args.steps} steps (first {args.skip} and the "
          "last left out)")
    print("delay s | setting | s / sample | ratio vs sync | model | step s | rollout wait s | rest s | "
          "played s | trainer idle | engine idle | staleness")
    for delay in args.delays:
        sync = summary(run(delay, args.steps, None), args.skip)
        rows = [("sync", sync)] + [(f"async k={k}", summary(run(delay, args.steps, k), args.skip)) for k in args.ks]
        for name, s in rows:
            ratio = sync["per_sample"] / s["per_sample"]
            model = f"{predicted(sync):.2f}x" if name != "sync" else "-"
            print(f"{delay:7.2f} | {name:9s} | {s['per_sample']:10.3f} | {ratio:12.2f}x | {model:>5s} "
                  f"| {s['step']:6.2f} | {s['rollout']:14.2f} | {s['rest']:6.2f} | {s['played']:8.2f} "
                  f"| {s['trainer_idle']:12.2f} | {s['engine_idle']:11.2f} | {s['staleness']:.2f}")
    if args.memory_steps:
        memory_check(args.delays[0], args.memory_steps)


if __name__ == "__main__":
    main()
