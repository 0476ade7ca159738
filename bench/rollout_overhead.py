"""How much of a rollout is spent outside generation (parsing, env steps, prompt building, batching)?

Runs one rollout of the default model through the ``hf`` engine (default: 8 frozen_lake envs, 3 turns) and prints
the total rollout time, the time inside ``engine.generate`` and the share outside it (target: < 5%).

    python bench/rollout_overhead.py [--env frozen_lake] [--n-envs 8] [--turns 3] [--max-new-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.models import DEFAULT_MODEL, load_model, load_tokenizer
from ragen.rollout import make_engine


class TimedEngine:
    """Wraps an engine and accumulates the wall time spent inside ``generate``."""

    def __init__(self, engine) -> None:  # noqa: ANN001 - any Engine
        self.engine, self.seconds, self.calls, self.tokens = engine, 0.0, 0, 0

    def generate(self, prompts, sampling):  # noqa: ANN001, ANN201 - Engine protocol
        start = time.perf_counter()
        samples = self.engine.generate(prompts, sampling)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.tokens += sum(len(s.token_ids) for s in samples)
        return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--env", default="frozen_lake")
    ap.add_argument("--n-envs", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=1)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    args = ap.parse_args()
    if args.n_envs % args.group_size:
        ap.error(f"--n-envs ({args.n_envs}) must be a multiple of --group-size ({args.group_size})")

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    tok = load_tokenizer(args.model)
    model = load_model(args.model)
    model.eval()
    engine = TimedEngine(make_engine("hf", model=model, tokenizer=tok))
    cfg = AgentConfig(max_turn=args.turns, max_new_tokens=args.max_new_tokens)
    spec = EnvGroupSpec(args.env, {}, n_groups=args.n_envs // args.group_size, group_size=args.group_size)
    proxy = AgentProxy(engine, tok, cfg, [spec], [], seed=args.seed)

    start = time.perf_counter()
    batch = proxy.rollout("train")
    total = time.perf_counter() - start
    outside = total - engine.seconds
    print(f"model={args.model} env={args.env} envs={args.n_envs} turns={args.turns} max_new={args.max_new_tokens}")
    print(f"batch: {batch.batch_size} x {batch.seq_len} tokens, {engine.calls} generate calls, {engine.tokens} sampled")
    print(f"total rollout time      : {total:8.3f} s")
    print(f"inside engine.generate  : {engine.seconds:8.3f} s")
    print(f"outside generation      : {outside:8.3f} s = {100 * outside / total:.2f}% (target < 5%), "
          f"{1000 * outside / max(engine.calls, 1):.1f} ms per turn")  # fmt: skip


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
