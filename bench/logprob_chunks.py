"""Chunked lm_head log-probs + entropy, forward and backward: the fused chunk against autograd through ``head(h)``.

    python bench/logprob_chunks.py                                   # N=2048, H=576, V=49152, fp32 and bf16
    python bench/logprob_chunks.py --n 1024 --dtypes fp32 --repeats 2
    python bench/logprob_chunks.py --device cuda --n 4096 --hidden 896 --vocab 151936 --dtypes bf16,bf16w

``ragen.workers.logprob.log_probs_from_hidden`` on one row of ``--n`` selected tokens (hidden states of width
``--hidden``, a bias-free ``nn.Linear`` head over ``--vocab`` tokens, chunks of ``--chunk``), with entropy, loss
``sum(log p) + 0.01 sum(H)``, backward to the hidden states and the head. Paths: ``fused`` (the default for a plain
linear head) and ``generic`` (``fused=False``: autograd through logsumexp, gather and softmax, with
torch.utils.checkpoint), each with ``checkpoint`` on (the default) and off. ``bf16`` runs under bf16 autocast (as
the CPU workers do), ``bf16w`` with bf16 weights and hidden states (as FSDP2's mixed-precision policy computes).
Seconds per forward + backward: median of ``--repeats`` rounds after a warm-up round, the cases interleaved in one
process. Peak memory above the inputs: the second forward + backward of a fresh process (CPU: its peak RSS, reset
after the first; the big tensors are mmapped and returned to the system when freed; Linux. CUDA: the allocator's
peak).
Prints each case's ratio to the generic path with the same ``checkpoint``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = (("generic", True), ("fused", True), ("generic", False), ("fused", False))


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _setup(args: argparse.Namespace):
    import torch
    from torch import nn

    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16w" else torch.float32
    head = nn.Linear(args.hidden, args.vocab, bias=False, device=args.device, dtype=dtype)
    hidden = torch.randn(1, args.n + 1, args.hidden, device=args.device, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, args.vocab, (1, args.n + 1), device=args.device)
    return head, hidden, ids


def _step(args: argparse.Namespace, head, hidden, ids, path: str, checkpoint: bool) -> float:
    """Forward + backward of one case; seconds."""
    import torch

    from ragen.workers.logprob import log_probs_from_hidden

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
        lp, ent = log_probs_from_hidden(head, hidden, ids, torch.ones_like(ids), chunk_size=args.chunk,
                                        with_entropy=True, checkpoint=checkpoint, fused=path == "fused")
    (lp.sum() + 0.01 * ent.sum()).backward()
    hidden.grad = head.weight.grad = None
    sync()
    return time.perf_counter() - t


def child(args: argparse.Namespace) -> dict:
    """``--case``: one forward + backward, peak memory above the inputs (MiB). Else every case, interleaved round
    by round (the machine's load changes alike for all), median seconds."""
    head, hidden, ids = _setup(args)
    if args.case:
        path, ck = args.case.split(":")
        _step(args, head, hidden, ids, path, ck == "True")  # one-off allocations (thread pools, caches)
        if args.device == "cuda":
            import torch
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            _step(args, head, hidden, ids, path, ck == "True")
            return {"peak_mib": (torch.cuda.max_memory_allocated() - base) / 2 ** 20}
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak RSS (VmHWM) to the current RSS
        base = _rss_mib()
        _step(args, head, hidden, ids, path, ck == "True")
        return {"peak_mib": _peak_rss_mib() - base}
    times: dict[str, list[float]] = {f"{p}:{c}": [] for p, c in CASES}
    for r in range(args.repeats + 1):
        for p, c in CASES:
            sec = _step(args, head, hidden, ids, p, c)
            if r:  # the first round warms up
                times[f"{p}:{c}"].append(sec)
    return {k: statistics.median(v) for k, v in times.items()}


def _child_run(args: argparse.Namespace, dtype: str, case: str = "") -> dict:
    cmd = [sys.executable, __file__, "--child", "--dtype", dtype, "--case", case, "--n", str(args.n),
           "--hidden", str(args.hidden), "--vocab", str(args.vocab), "--chunk", str(args.chunk),
           "--repeats", str(args.repeats), "--threads", str(args.threads), "--device", args.device]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--dtypes", default="fp32,bf16",
                   help="comma-separated: fp32, bf16 (bf16 autocast), bf16w (bf16 weights and hidden states)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--case", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import torch
        torch.set_num_threads(args.threads)
        print(json.dumps(child(args)))
        return
    print(f"{args.device}: N={args.n} H={args.hidden} V={args.vocab} chunk={args.chunk} threads={args.threads}, "
          "with entropy")
    for dtype in args.dtypes.split(","):
        sec = _child_run(args, dtype)
        mem = {f"{p}:{c}": _child_run(args, dtype, f"{p}:{c}")["peak_mib"] for p, c in CASES}
        for path, ck in CASES:
            k, ref = f"{path}:{ck}", f"generic:{ck}"
            print(f"{dtype:5} {path:8} checkpoint={ck!s:5}  {sec[k]:.3f} s  peak +{mem[k]:.0f} MiB  "
                  f"time / generic {sec[k] / sec[ref]:.2f}  memory / generic {mem[k] / max(mem[ref], 1e-9):.2f}")


if __name__ == "__main__":
    main()
