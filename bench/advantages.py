"""Benchmark the GAE-family advantage estimators against their per-token Python-loop references.

Batch: B=64 trajectories of T=16384 tokens, 18-22 turns each (400-700 model tokens per turn, 100-250 env
observation tokens between turns, a 200-400 token prompt, right/left padding, some truncated rows).
For each of gae, turn_gae, bilevel_gae, weighted_gae it times the whole ``compute_advantage`` call (validation
included) against the plain per-token loop reference. The loop reference is slow, so it runs on a subset of rows
and its time is scaled per row to the full batch (stated in the output); the outputs on that subset are checked.
Advantage estimation is a tiny share of a training step (``bench/train_step.py``), so the implementation is the
simplest vectorised code; this bench only guards against a regression to per-token Python loops.

These machines are noisy, so the measurements are interleaved: each round times the loop reference once and
then the estimator ``--repeats`` times (their median), and the round's speed-up is reference / estimator. The table
shows the median over rounds of each time (min in brackets) and of each round's speed-up. Two parameter sets are
timed: the benchmark's (lam < 1, so the token-level recursions run) and compute_advantage's defaults
(gamma = lam = 1).

Usage: python bench/advantages.py [--rows-ref 8] [--threads 1] [--repeats 3] [--rounds 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ragen.algorithms import compute_advantage  # noqa: E402
from ragen.algorithms.reference import REFERENCES, random_inputs  # noqa: E402

ESTIMATORS = ("gae", "turn_gae", "bilevel_gae", "weighted_gae")
PARAM_SETS = {
    "bench": dict(gamma=1.0, lam=0.95, high_level_gamma=0.95, high_level_lam=0.95, turn_level_weight=0.5),
    "defaults": dict(gamma=1.0, lam=1.0, high_level_gamma=0.95, high_level_lam=1.0, turn_level_weight=0.5),
}


def _ref_kwargs(name: str, params: dict) -> dict:
    import inspect

    accepted = inspect.signature(REFERENCES[name]).parameters
    return {k: v for k, v in params.items() if k in accepted}


def _time(fn, repeats: int) -> tuple[float, object]:
    """Median wall time of ``fn()`` over ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _rounds(ref_fn, paths: dict, rounds: int, repeats: int) -> tuple[list[float], dict, dict, object, dict]:
    """Interleaved timing: per round, the reference once, then each path (median of ``repeats`` calls).

    Returns (reference times, per-path times, per-path speed-ups, last reference output, last path outputs).
    """
    ref_times, times, ratios, outs, ref_out = [], {p: [] for p in paths}, {p: [] for p in paths}, {}, None
    for fn in paths.values():  # warm-up
        fn()
    for _ in range(rounds):
        ref, ref_out = _time(ref_fn, 1)
        ref_times.append(ref)
        for path, fn in paths.items():
            t, outs[path] = _time(fn, repeats)
            times[path].append(t)
            ratios[path].append(ref / t)
    return ref_times, times, ratios, ref_out, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--rows-ref", type=int, default=8, help="rows the slow loop reference runs on")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads for the vectorised code")
    ap.add_argument("--repeats", type=int, default=3, help="calls of each path per round (their median)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (reference once, then each path)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    inp = random_inputs(
        args.batch, seed=0, min_turns=18, max_turns=22, model_len=(400, 700), env_len=(100, 250),
        prompt_len=(200, 400), T=args.seq_len, dtype=torch.float32,
    )
    n_model = int(inp.response_mask.sum())
    turns = inp.num_turns.float()
    print(f"batch B={args.batch} T={args.seq_len}: {n_model} model tokens "
          f"({n_model / inp.response_mask.numel():.0%}), turns/row mean {turns.mean():.1f} "
          f"(min {int(turns.min())}, max {int(turns.max())}), {int(inp.truncated.sum())} truncated rows; "
          f"float32, torch threads={args.threads}")
    rows = list(range(min(args.rows_ref, args.batch)))
    scale = args.batch / len(rows)
    print(f"{args.rounds} interleaved rounds: the loop reference on {len(rows)} of {args.batch} rows (time scaled "
          f"x{scale:g}), then the estimator on the full batch (median of {args.repeats} calls); medians over rounds "
          f"(min in brackets); speed-up = median of the rounds' reference / path; max |diff| = largest difference "
          f"from the reference on those rows")
    for label, params in PARAM_SETS.items():
        print(f"\n[{label}] {params}")
        print(f"{'estimator':<14}{'time':>18}{'speed-up':>10}"
              f"{'loop ref (scaled)':>20}{'max |diff|':>12}")
        for name in ESTIMATORS:
            call = functools.partial(compute_advantage, name, inp, **params)
            loop = functools.partial(REFERENCES[name], inp, rows=rows, **_ref_kwargs(name, params))
            ref_times, times, ratios, (ref_adv, ref_ret), outs = _rounds(
                loop, {"vectorised": call}, args.rounds, args.repeats,
            )
            ref_times = [t * scale for t in ref_times]
            for path in ratios:
                ratios[path] = [r * scale for r in ratios[path]]
            diff = max(max((adv[rows] - torch.tensor(ref_adv, dtype=adv.dtype)).abs().max().item(),
                           (ret[rows] - torch.tensor(ref_ret, dtype=ret.dtype)).abs().max().item())
                       for adv, ret in outs.values())
            cells = [f"{f'{statistics.median(times[p]) * 1e3:.1f} ms ({min(times[p]) * 1e3:.1f})':>18}"
                     f"{statistics.median(ratios[p]):>9.0f}x" for p in ratios]
            print(f"{name:<14}{''.join(cells)}{statistics.median(ref_times):>18.2f} s{diff:>12.2e}")

if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
