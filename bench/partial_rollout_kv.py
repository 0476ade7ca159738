"""What a weight load costs an episode in flight under partial rollouts (``trainer.partial_rollouts``): the hf engine
keeps each sequence's KV cache between turns (``prefix_cache``, on for multi-turn envs) and a load drops them (they
belong to the old weights), so the next turn prefills its whole history again under the new weights.

One rollout batch of FrozenLake episodes is played twice per round with the same seeds: without a load, and with one
weight load (``update_weights`` with the engine's own weights, the call a sync makes, so the tokens sampled stay the
same) before the ``--load-at``-th generate call, as a partial rollout meets one sync per update. Reported (median over
``--rounds`` interleaved rounds): prompt tokens the engine prefilled (sent minus those its prefix cache reused) and
the batch's rollout seconds, and their differences: the recompute one load costs the batch.

Usage: python bench/partial_rollout_kv.py [--model default|tiny] [--turns 5] [--episodes 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class LoadOnce:
    """The engine, with one ``update_weights`` (its own weights) before the ``at``-th generate call (1-based;
    0: never)."""

    def __init__(self, engine, at: int):  # noqa: ANN001
        self.engine, self.at, self.calls = engine, at, 0
        self.weights = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.engine, name)

    def generate(self, prompts, sampling):  # noqa: ANN001, ANN201
        self.calls += 1
        if self.calls == self.at:
            self.engine.update_weights(self.weights)
        return self.engine.generate(prompts, sampling)


def rollout(args: argparse.Namespace, tok, model, load_at: int) -> dict[str, float]:  # noqa: ANN001
    from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
    from ragen.rollout.hf import HFEngine

    engine = HFEngine(model, tok, prefix_cache=True)
    wrapped = LoadOnce(engine, load_at)
    cfg = AgentConfig(max_turn=args.turns, max_new_tokens=args.new_tokens, think=False, response_prefix="<answer>")
    groups = [EnvGroupSpec("frozen_lake", {}, n_groups=args.episodes, group_size=1, max_turn=args.turns,
                           max_actions_per_turn=1)]
    proxy = AgentProxy(wrapped, tok, cfg, groups, [], seed=1)
    start = time.perf_counter()
    batch = proxy.rollout("train")
    seconds = time.perf_counter() - start
    sent = batch.metrics["agent/prompt_tokens"]
    return {"prompt_tokens": sent, "prefilled_tokens": sent - engine.prefix_store.reused_tokens, "seconds": seconds,
            "generate_calls": float(wrapped.calls), "turns": batch.metrics["env/frozen_lake/turns"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("default", "tiny"), default="default")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--load-at", type=int, default=3, help="the generate call the load comes before (1-based)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    from ragen.models import load_model, load_tokenizer, tiny_model

    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    model = tiny_model(tokenizer=tok, seed=0) if args.model == "tiny" else load_model()
    print(f"{args.model} model, frozen_lake x {args.episodes} episodes, up to {args.turns} turns of one move, "
          f"{args.new_tokens} new tokens a turn, one load before generate call {args.load_at}")
    runs: dict[str, list[dict[str, float]]] = {"no load": [], "one load": []}
    for _ in range(args.rounds):
        runs["no load"].append(rollout(args, tok, model, 0))
        runs["one load"].append(rollout(args, tok, model, args.load_at))
    print(f"{'per batch':<26}{'no load':>12}{'one load':>12}{'difference':>12}")
    for key in ("prompt_tokens", "prefilled_tokens", "seconds", "generate_calls", "turns"):
        a, b = (statistics.median(r[key] for r in runs[m]) for m in runs)
        label = "rollout seconds" if key == "seconds" else key
        print(f"{label:<26}{a:>12.2f}{b:>12.2f}{b - a:>+12.2f}")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
