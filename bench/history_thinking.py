"""Compute cost of ``agent.history_thinking=strip`` against ``keep``: one rollout batch of the tiny model (hf engine,
prefix cache on as the trainer sets it for multi-turn envs) on FrozenLake in the ``turn`` layout, each turn's thinking
a forced response prefix ``<think>...</think>`` of about ``--think-tokens`` tokens (the tiny random model never closes a
think block itself; a forced block is thinking the next prompt sees under ``keep`` and not under ``strip``).

Per episode it reports the prompt tokens sent to the engine (``agent/prompt_tokens``), the prompt tokens the engine
prefilled (sent minus those its prefix cache reused), the tokens of the training rows (the turn layout's rows: what
the old-log-prob, reference and update passes run over) and the thinking tokens cut; and the rollout time, the
median over ``--rounds`` interleaved rounds (these machines are shared and noisy).

Usage: python bench/history_thinking.py [--turns 5] [--think-tokens 48] [--new-tokens 32] [--episodes 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rollout(mode: str, args: argparse.Namespace, tok, model, prefix: str) -> dict[str, float]:  # noqa: ANN001
    from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
    from ragen.rollout.hf import HFEngine

    engine = HFEngine(model, tok, prefix_cache=True)
    cfg = AgentConfig(max_turn=args.turns, max_new_tokens=args.new_tokens, layout="turn", history_thinking=mode,
                      response_prefix=prefix, max_model_len=8192)
    groups = [EnvGroupSpec("frozen_lake", {}, n_groups=args.episodes // 4, group_size=4)]
    proxy = AgentProxy(engine, tok, cfg, groups, [], seed=1)
    start = time.perf_counter()
    batch = proxy.rollout("train")
    seconds = time.perf_counter() - start
    n = args.episodes
    sent = batch.metrics["agent/prompt_tokens"]
    return {"prompt_tokens": sent / n, "prefilled_tokens": (sent - engine.prefix_store.reused_tokens) / n,
            "row_tokens": float(batch.attention_mask.sum()) / n,
            "stripped_tokens": batch.metrics["agent/think_stripped_tokens"] / n, "seconds": seconds,
            "turns": batch.metrics["env/frozen_lake/turns"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--think-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    from ragen.models import load_tokenizer, tiny_model

    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    model = tiny_model(tokenizer=tok, seed=0)
    words = " ".join(["plan"] * args.think_tokens)
    think = tok.decode(tok(words, add_special_tokens=False)["input_ids"][: args.think_tokens])
    prefix = f"<think>{think}</think>\n"
    print(f"tiny model, frozen_lake x {args.episodes} episodes, {args.turns} turns, forced think prefix of "
          f"{len(tok(prefix, add_special_tokens=False)['input_ids'])} tokens, {args.new_tokens} new tokens per turn")
    runs: dict[str, list[dict[str, float]]] = {"keep": [], "strip": []}
    for _ in range(args.rounds):
        for mode in runs:
            runs[mode].append(rollout(mode, args, tok, model, prefix))
    print(f"{'per episode':<22}{'keep':>12}{'strip':>12}{'strip/keep':>12}")
    for key in ("prompt_tokens", "prefilled_tokens", "row_tokens", "stripped_tokens", "seconds", "turns"):
        k, s = (statistics.median(r[key] for r in runs[m]) for m in ("keep", "strip"))
        ratio = f"{s / k:.2f}" if k else "-"
        label = "rollout seconds (batch)" if key == "seconds" else key
        print(f"{label:<22}{k:>12.1f}{s:>12.1f}{ratio:>12}")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
