"""OpenMP wait policy on a shared CPU: hf-engine generation time with spinning (ACTIVE) vs passive idle threads.

    python bench/omp_wait_policy.py                  # alone, then beside one competing torch process
    python bench/omp_wait_policy.py --prompts 32 --new-tokens 8 --repeats 2

Each measurement is a fresh ``python -c`` process (the policy is read when torch loads its OpenMP runtime) that
loads the default model in the engine's auto dtype and times ``HFEngine.generate`` on ``--prompts`` prompts of ~150
tokens. The competitor is another process running matmuls on as many threads, as a second job on the machine would.
Prints seconds per policy and the ACTIVE / PASSIVE ratio, alone and beside the competitor (why ragen's programs set
``OMP_WAIT_POLICY=PASSIVE``, ``ragen.allocator.tune_process``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = """
from ragen.allocator import tune_process; tune_process()  # as ragen's programs do; the policy is set below
import random, time
from ragen.rollout.base import SamplingParams
from ragen.rollout.hf import HFEngine
from ragen.utils.hardware import resolve_dtype
eng = HFEngine(dtype=resolve_dtype("auto", "cpu")[0])
rng = random.Random(0)
shared = eng.tokenizer("You are playing a game on a grid. " * 12)["input_ids"][:75]
prompts = [shared + [rng.randrange(1000, 20000) for _ in range(75 + rng.randrange(50))] for _ in range({n})]
eng.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=2, seed=0))  # warm-up
t = time.perf_counter()
eng.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens={new}, seed=0))
print(time.perf_counter() - t)
"""
COMPETITOR = "import torch\na = torch.randn(512, 512)\nwhile True:\n    a @ a\n"


def timed_generation(policy: str, prompts: int, new_tokens: int, threads: int) -> float:
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", CHILD.format(n=prompts, new=new_tokens)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    for label, competing in (("alone", False), ("beside one competing process", True)):
        rival = None
        if competing:
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # the rival keeps OpenMP's default policy
            rival = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=env)
        try:
            res = {pol: [timed_generation(pol, args.prompts, args.new_tokens, args.threads)
                         for _ in range(args.repeats)] for pol in ("ACTIVE", "PASSIVE")}
        finally:
            if rival is not None:
                rival.kill()
        best = {pol: min(v) for pol, v in res.items()}
        print(f"{label}: ACTIVE {best['ACTIVE']:.2f} s, PASSIVE {best['PASSIVE']:.2f} s "
              f"(best of {args.repeats}; {args.prompts} prompts x {args.new_tokens} new tokens, {args.threads} threads)"
              f" -> ACTIVE / PASSIVE = {best['ACTIVE'] / best['PASSIVE']:.2f}", flush=True)


if __name__ == "__main__":
    main()
