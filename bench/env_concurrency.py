"""Rollout wall time with a latency-bound env: env calls one after another (``agent.env_workers=1``) against the
default pool (``agent.env_workers=32``, one thread per episode here), in one run.

The env is a stand-in for a search tool or a sandbox: FrozenLake whose every ``step`` first sleeps a fixed wall time
(``--delays``; the sleep holds no CPU and releases the GIL, as a call waiting on I/O does). The model is real (the
hf engine on ``--model``, the tiny random model by default): each turn it samples ``--think-tokens`` tokens of
thinking, then the response is closed with an answer move chosen from the sampled ids, so turns step their env
whatever the model writes (a thinking text holding a tag of its own is malformed and steps nothing; the bench counts
the turns that stepped). Both settings play the same episodes
(same seeds); the bench checks that their batches are identical and prints, per delay, the wall time per rollout,
the ratio, the env steps and the env time alone would take (steps x delay one after another, turns x delay at once).

Usage: python bench/env_concurrency.py [--delays 0 0.5 2] [--episodes 8] [--turns 3] [--think-tokens 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec  # noqa: E402
from ragen.env import StepResult, make, register  # noqa: E402
from ragen.models import DEFAULT_MODEL, load_model, load_tokenizer, tiny_model  # noqa: E402
from ragen.rollout import make_engine  # noqa: E402

MOVES = ("Left", "Down", "Right", "Up")


@register("sleepy")
class SleepyEnv:
    """Env ``inner`` whose every ``step`` first sleeps ``delay_s`` seconds of wall time (resets are not delayed)."""

    def __init__(self, inner: str = "frozen_lake", delay_s: float = 0.5) -> None:
        self.inner, self.delay_s = make(inner), float(delay_s)

    @property
    def instructions(self) -> str:
        return self.inner.instructions

    def legal_actions(self) -> str:
        return self.inner.legal_actions()

    def reset(self, seed: int) -> str:
        return self.inner.reset(seed)

    def step(self, action: str) -> StepResult:
        time.sleep(self.delay_s)
        return self.inner.step(action)


class AnsweringEngine:
    """The real engine samples ``think_tokens`` tokens of thinking; the response is then closed with an answer whose
    move is chosen by the sampled ids (appended tokens: log-prob 0)."""

    def __init__(self, engine, tok, think_tokens: int) -> None:  # noqa: ANN001 - Engine, tokenizer
        self.engine, self.tok, self.think_tokens, self.seconds = engine, tok, think_tokens, 0.0

    def generate(self, prompts, sampling):  # noqa: ANN001, ANN201 - Engine protocol
        start = time.perf_counter()
        samples = self.engine.generate(prompts, dataclasses.replace(sampling, max_new_tokens=self.think_tokens,
                                                                    stop=()))
        self.seconds += time.perf_counter() - start
        out = []
        for sample in samples:
            ids = [i for i in sample.token_ids if i not in sampling.stop_token_ids]
            tail = self.tok(f"</think><answer>{MOVES[sum(ids) % 4]}</answer>", add_special_tokens=False)["input_ids"]
            out.append(dataclasses.replace(sample, token_ids=ids + tail, log_probs=[*sample.log_probs[: len(ids)]]
                                           + [0.0] * len(tail), finish_reason="stop"))
        return out


def run(engine, tok, args: argparse.Namespace, delay: float, workers: int) -> tuple[float, float, object]:  # noqa: ANN001
    """(rollout seconds, generate seconds, batch) of one rollout of ``--episodes`` sleepy FrozenLake episodes."""
    cfg = AgentConfig(max_turn=args.turns, max_new_tokens=args.think_tokens + 16, response_prefix="<think>",
                      env_workers=workers)
    spec = EnvGroupSpec("sleepy", {"delay_s": delay}, n_groups=args.episodes, group_size=1, max_actions_per_turn=1)
    answering = AnsweringEngine(engine, tok, args.think_tokens)
    proxy = AgentProxy(answering, tok, cfg, [spec], [], seed=args.seed)
    start = time.perf_counter()
    batch = proxy.rollout("train")
    return time.perf_counter() - start, answering.seconds, batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help=f"'tiny' (random, 3M parameters: generation stays small beside the "
                    f"env's latency) or a model alias or folder, e.g. {DEFAULT_MODEL}")
    ap.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.5, 2.0], help="seconds per step (0: CPU-bound)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--think-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    model = tiny_model(tokenizer=tok) if args.model == "tiny" else load_model(args.model)
    if args.model != "tiny":
        tok = load_tokenizer(args.model)
    engine = make_engine("hf", model=model.eval(), tokenizer=tok)
    print(f"model={args.model} episodes={args.episodes} turns={args.turns} think_tokens={args.think_tokens}")
    print("delay s | env_workers=1 s | env_workers=32 s | ratio | generate s (1 / 32) | env steps | "
          "env time alone (1 / 32) s | identical")
    for delay in args.delays:
        seq_s, seq_gen, seq_batch = run(engine, tok, args, delay, workers=1)
        con_s, con_gen, con_batch = run(engine, tok, args, delay, workers=32)
        steps = sum(t.format_ok for ep in seq_batch.episodes for t in ep.turns)  # turns that stepped their env
        turns = int(seq_batch.num_turns.max())
        same = all(torch.equal(getattr(seq_batch, k), getattr(con_batch, k))
                   for k in ("input_ids", "response_mask", "token_rewards", "sample_log_probs", "turn_rewards"))
        print(f"{delay:7.2f} | {seq_s:15.2f} | {con_s:16.2f} | {seq_s / con_s:5.2f}x | {seq_gen:6.2f} / {con_gen:6.2f} "
              f"| {steps:9d} | {steps * delay:7.1f} / {turns * delay:5.1f} | {same}")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
