"""Benchmark the GAE-family advantage estimators against their per-token Python-loop references.

Batch: B=64 trajectories of T=16384 tokens, 18-22 turns each (400-700 model tokens per turn, 100-250 env
observation tokens between turns, a 200-400 token prompt, right/left padding, some truncated rows).
For each of gae, turn_gae, bilevel_gae, weighted_gae it prints the time of the whole ``compute_advantage`` call
(validation included; median of repeats, min in brackets) on its two implementations, the fused C++ CPU kernel
(``ragen.algorithms.fused``, what CPU tensors use) and the tensor code (what CUDA tensors use, or CPU tensors
with RAGEN_FUSED_GAE=0), and each one's speed-up over the plain per-token loop reference measured in the same
run (median of its repeats). The loop reference is slow,
so it runs on a subset of rows and its time is scaled per row to the full batch (stated in the output); the
outputs on that subset are also checked against the vectorised ones. Two parameter sets are timed: the
benchmark's (lam < 1, so the token-level scans run) and compute_advantage's defaults (gamma = lam = 1).

Usage: python bench/advantages.py [--rows-ref 8] [--threads 1] [--repeats 9] [--ref-repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ragen.algorithms import compute_advantage, fused  # noqa: E402
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


def _median_time(fn, repeats: int) -> tuple[float, float, object]:
    """(median, min) wall time of ``fn()`` over ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--rows-ref", type=int, default=8, help="rows the slow loop reference runs on")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads for the vectorised code")
    ap.add_argument("--repeats", type=int, default=9, help="timed calls of the vectorised estimator")
    ap.add_argument("--ref-repeats", type=int, default=3, help="timed runs of the loop reference")
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
    if not fused.available():
        sys.exit("the fused kernel is not built: run `pip install -e .` (needs a C++ compiler)")
    print(f"median (min) of {args.repeats} compute_advantage calls on the full batch; loop reference: "
          f"median of {args.ref_repeats} runs on {len(rows)} of {args.batch} rows, time scaled x{scale:g}; "
          f"max |diff| = largest difference of either path from the reference on those rows")
    for label, params in PARAM_SETS.items():
        print(f"\n[{label}] {params}")
        print(f"{'estimator':<14}{'fused kernel':>18}{'speed-up':>10}{'tensor code':>18}{'speed-up':>10}"
              f"{'loop ref (scaled)':>20}{'max |diff|':>12}")
        for name in ESTIMATORS:
            call = functools.partial(compute_advantage, name, inp, **params)
            loop = functools.partial(REFERENCES[name], inp, rows=rows, **_ref_kwargs(name, params))
            ref, _, (ref_adv, ref_ret) = _median_time(loop, args.ref_repeats)
            ref *= scale
            cells, diff = [], 0.0
            for path in ("fused", "tensor"):
                with fused.disabled() if path == "tensor" else contextlib.nullcontext():
                    call()  # warm-up
                    med, low, (adv, ret) = _median_time(call, args.repeats)
                diff = max(diff, (adv[rows] - torch.tensor(ref_adv, dtype=adv.dtype)).abs().max().item(),
                           (ret[rows] - torch.tensor(ref_ret, dtype=ret.dtype)).abs().max().item())
                cells.append(f"{f'{med * 1e3:.1f} ms ({low * 1e3:.1f})':>18}{ref / med:>9.0f}x")
            print(f"{name:<14}{''.join(cells)}{ref:>18.2f} s{diff:>12.2e}")


if __name__ == "__main__":
    main()
