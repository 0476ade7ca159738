"""Benchmark the rollout engines: the same prompts through the ``hf`` and ``vllm`` engines, tokens/s of each and
their ratio, in one run.

Prompts: ``--prompts`` chat prompts (short instructions of varied length) on the default model, sampled at
temperature 1 with per-request seeds for ``--max-new-tokens`` tokens (``max_new_tokens`` is also the floor: EOS is
not suppressed, so both engines stop where the model ends its turn; throughput counts the tokens actually
generated). Both engines use the same dtype. Each engine is warmed up with one short call, then the whole prompt set
is timed ``--rounds`` times (the median is reported, min in brackets). vLLM's start-up time (import + engine
start) is reported separately: on a 2-core CPU it is ~30-100 s and not part of the throughput.
Threads: vLLM's CPU worker computes on the machine's cores less one it reserves for its engine process (one
thread on a 2-core machine); ``--threads`` (default: the same count) sets the hf engine's torch threads, so both
compute on the same number of cores.

Run it in the vLLM env (``bash scripts/setup_vllm_env.sh``):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python bench/rollout_engines.py [--prompts 32] [--max-new-tokens 64]

vLLM spawns its engine process, so everything runs under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOPICS = ["the sea", "a cat", "rain", "mountains", "coffee", "a train", "the moon", "music", "a city", "winter",
          "bread", "a library"]


def make_prompts(tok, n: int) -> list[list[int]]:
    """``n`` chat prompts of varied length (1-3 sentences of instruction)."""
    out = []
    for i in range(n):
        text = f"Write a short poem about {TOPICS[i % len(TOPICS)]}." + " Use simple words." * (i % 3)
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    return out


def time_engine(engine, prompts, sampling, rounds: int) -> tuple[list[float], int]:
    """(seconds per round, tokens generated per round)."""
    from ragen.rollout.base import SamplingParams

    engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=4, seed=1))  # warm-up
    times, tokens = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        samples = engine.generate(prompts, sampling)
        times.append(time.perf_counter() - start)
        tokens = sum(len(s.token_ids) for s in samples)
    return times, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--hf-batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    args = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import torch

    from ragen.models import load_tokenizer
    from ragen.models.loader import DEFAULT_MODEL, resolve_model_path
    from ragen.rollout.base import SamplingParams
    from ragen.rollout.hf import HFEngine

    path = resolve_model_path(DEFAULT_MODEL)
    tok = load_tokenizer(path)
    prompts = make_prompts(tok, args.prompts)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    results = {}

    torch.set_num_threads(args.threads)
    hf = HFEngine(path, tok, dtype=args.dtype, batch_size=args.hf_batch_size)
    results["hf"] = time_engine(hf, prompts, sampling, args.rounds)
    del hf

    start = time.perf_counter()
    from ragen.rollout.vllm_engine import VLLMEngine

    vllm = VLLMEngine(path, tok, dtype=args.dtype, enforce_eager=True, max_model_len=1024,
                      max_num_seqs=args.prompts)
    startup = time.perf_counter() - start
    results["vllm"] = time_engine(vllm, prompts, sampling, args.rounds)

    print(f"{args.prompts} prompts x <= {args.max_new_tokens} sampled tokens, {args.dtype}, "
          f"{os.cpu_count()} cores (hf: {args.threads} threads), median of {args.rounds} rounds (min); "
          f"vLLM {vllm.version} start-up {startup:.0f} s")
    rate = {}
    for name, (times, tokens) in results.items():
        rate[name] = tokens / statistics.median(times)
        print(f"  {name:5s} {rate[name]:7.1f} tokens/s ({tokens / min(times):.1f})  {tokens} tokens, "
              f"{statistics.median(times):.1f} s")
    print(f"  vllm / hf = {rate['vllm'] / rate['hf']:.2f}")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
