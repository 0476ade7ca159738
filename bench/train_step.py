"""Benchmark one PPO actor step against a bare torch training loop on the same batch, in the same run.

    python bench/train_step.py                       # default model, batch 8 x 512, 2 threads
    python bench/train_step.py --micro 8 --repeats 3
    python bench/train_step.py --batch 8 --seq-len 190 --shared-prefix 120 --micro 8   # a bandit-like batch
    python bench/train_step.py --batch 16 --seq-len 380 --shared-prefix 120 --prompts 2 --micro 4   # prompt grouping

Ours: ``PolicyWorker`` (through ``LocalWorkerGroup``): ``compute_log_probs`` (old log-probs, no grad) and
``update`` (1 mini-batch of all sequences, micro-batches of ``--micro`` with gradient accumulation, chunked
log-probs, PPO clipped loss, grad clip, AdamW). Bare: the plain transformers forward under the same precision
(``--precision``, default ``auto``: bf16 autocast where the CPU has native bf16, else fp32), full log_softmax
over the logits, the same clipped loss formula, backward, clip, AdamW step.
Prints the phase breakdown, tokens/s, ``ratio = bare_time / ours`` (goal >= 0.8), the process's peak RSS, and its
user / system CPU time and page faults (run once more with ``RAGEN_TUNE_MALLOC=0`` to see what the allocator
settings of ragen's programs, ``ragen.allocator``, save).
``--lora R`` also times the LoRA actor (``actor.lora_rank=R``: frozen base, adapters trained) in the same
alternation and prints ``full / lora``. With ``--shared-prefix N``
the rows share their first N tokens, as the rows of one env's batch share the system prompt and instructions: ours
then runs the shared-prefix packing (``ragen.models.packing``), the bare loop the plain batch. The two loops alternate
and each reports its best of ``--repeats`` steps after a warm-up, since background load on a shared machine
only ever adds time. ``--prompts K`` gives the rows K different prompts (the first half of a row; the first
``--shared-prefix`` tokens common to all), interleaved as a batch of K episode groups arrives, and also times ours
with the rows kept in batch order (micro-batches then mix prompts and share only the common prefix), printing
``ungrouped / grouped``: the gain of ``TrainBatch.prompt_order`` and ``prompt_chunks``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import resource
import time

import torch
from gpu_bench import bare_step  # the same plain PPO step as the GPU bench's reference (bench/ is on sys.path)


def make_batch(batch: int, seq_len: int, vocab: int, seed: int = 0, shared_prefix: int = 0, prompts: int = 0):
    """Random ids (the first ``shared_prefix`` equal in every row; with ``prompts`` K > 0 row i's first half, its
    prompt, equal to row i % K's), full attention, response mask on the second half, random advantages."""
    from ragen.workers import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
    if prompts > 0:
        ids[:, :seq_len // 2] = ids[torch.arange(batch) % prompts, :seq_len // 2]
    ids[:, :shared_prefix] = ids[0, :shared_prefix]
    attn = torch.ones(batch, seq_len, dtype=torch.long)
    resp = torch.zeros(batch, seq_len, dtype=torch.long)
    resp[:, seq_len // 2:] = 1
    adv = torch.randn(batch, seq_len, generator=g) * resp
    return TrainBatch(ids, attn, resp, advantages=adv)


@contextlib.contextmanager
def rows_in_batch_order():
    """Ours without prompt grouping: rows keep the batch's order and micro-batches are plain chunks."""
    from ragen.workers import trainable

    saved = trainable._in_prompt_order, trainable._micro_chunks
    trainable._in_prompt_order = lambda b: (b, None)
    trainable._micro_chunks = lambda b, size: b.chunk(size)
    try:
        yield
    finally:
        trainable._in_prompt_order, trainable._micro_chunks = saved


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model alias / folder / hub id (default: ragen.models.DEFAULT_MODEL)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--micro", type=int, default=4, help="micro-batch size (sequences) for both loops")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per loop after one warm-up step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shared-prefix", type=int, default=0, help="tokens every row shares from position 0")
    p.add_argument("--prompts", type=int, default=0, help="rows from this many different prompts, interleaved "
                   "(0 = every row its own prompt); also times ours without prompt grouping")
    p.add_argument("--lora", type=int, default=0, help="also time a LoRA actor of this rank (0 = no)")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="mixed precision of both loops (auto: bf16 only where the CPU has native bf16)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from ragen.models import DEFAULT_MODEL, load_model
    from ragen.utils.hardware import resolve_precision
    from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker

    name = args.model or DEFAULT_MODEL
    precision, why = resolve_precision(args.precision, torch.device("cpu"))
    cfg = ActorConfig(lr=1e-6, mini_batch_size=args.batch, micro_batch_size=args.micro, mixed_precision=precision,
                      clip_high=0.2)
    ours, t_init = timed(lambda: LocalWorkerGroup(PolicyWorker, model_name_or_path=name, cfg=cfg))
    vocab = ours.worker.config.vocab_size
    batch = make_batch(args.batch, args.seq_len, vocab, shared_prefix=args.shared_prefix, prompts=args.prompts)
    tokens = args.batch * args.seq_len
    ours.call("compute_log_probs", batch.select(slice(0, 1)))  # warm-up (kernel selection)
    old, t_lp = timed(lambda: ours.call("compute_log_probs", batch))
    batch = batch.with_fields(old_log_probs=old)

    bare = load_model(name, dtype=torch.float32)
    bare.train()
    opt = torch.optim.AdamW(bare.parameters(), lr=1e-6, weight_decay=0.01, foreach=True)

    lora = None
    if args.lora:
        lora_cfg = dataclasses.replace(cfg, lora_rank=args.lora, lora_alpha=2.0 * args.lora)
        lora = LocalWorkerGroup(PolicyWorker, model_name_or_path=name, cfg=lora_cfg)
    ours_times, bare_times, lora_times, mixed_times = [], [], [], []
    for i in range(args.repeats + 1):  # alternate so background load hits all loops alike; step 0 = warm-up
        metrics, t_ours = timed(lambda: ours.call("update", batch))
        _, t_bare = timed(lambda: bare_step(bare, opt, batch, args.micro, "cpu", precision == "bf16"))
        t_lora = timed(lambda: lora.call("update", batch))[1] if lora is not None else float("nan")
        if args.prompts:
            with rows_in_batch_order():
                mixed_times.append(timed(lambda: ours.call("update", batch))[1])
        print(f"step {i}{' (warm-up)' if i == 0 else ''}: ours update {t_ours:.2f} s, bare {t_bare:.2f} s, "
              f"{f'lora {t_lora:.2f} s, ' if lora is not None else ''}"
              f"pg_loss {metrics['actor/pg_loss']:.4f}, grad_norm {metrics['actor/grad_norm']:.3f}", flush=True)
        if i > 0:
            ours_times.append(t_ours)
            bare_times.append(t_bare)
            lora_times.append(t_lora)
    # best of N: on a shared machine background load only ever adds time, so the minimum is the estimate
    t_ours, t_bare = min(ours_times), min(bare_times)
    print(f"\nmodel {name}, batch {args.batch} x {args.seq_len} ({tokens} tokens, response on the second half, "
          f"first {args.shared_prefix} shared), "
          f"micro {args.micro}, threads {torch.get_num_threads()}, {precision} compute + fp32 master weights ({why})")
    print(f"  worker init             {t_init:7.2f} s")
    print(f"  phase log-probs (old)   {t_lp:7.2f} s   {tokens / t_lp:8.0f} tokens/s")
    print(f"  phase actor update      {t_ours:7.2f} s   {tokens / t_ours:8.0f} tokens/s  (best of {len(ours_times)})")
    print(f"  one PPO actor step      {t_lp + t_ours:7.2f} s   {tokens / (t_lp + t_ours):8.0f} tokens/s")
    print(f"  bare torch update       {t_bare:7.2f} s   {tokens / t_bare:8.0f} tokens/s  (best of {len(bare_times)})")
    print(f"  ratio bare / ours       {t_bare / t_ours:7.2f}   (goal >= 0.8)")
    if args.prompts:
        t_mixed = min(mixed_times[1:])
        print(f"  ours, rows in batch order {t_mixed:5.2f} s   {tokens / t_mixed:8.0f} tokens/s  "
              f"({args.prompts} prompts interleaved, no grouping)")
        print(f"  ratio ungrouped / grouped {t_mixed / t_ours:5.2f}   (> 1: grouping rows by prompt pays)")
    if lora is not None:
        t_lora = min(lora_times)
        t_lora_lp = timed(lambda: lora.call("compute_log_probs", batch))[1]
        print(f"  LoRA r={args.lora} actor update  {t_lora:7.2f} s   {tokens / t_lora:8.0f} tokens/s  "
              f"(log-probs {t_lora_lp:.2f} s)")
        print(f"  ratio full / lora       {t_ours / t_lora:7.2f}   (> 1: LoRA's update is faster)")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    models = "both models" + (" + the LoRA actor" if lora else "")
    print(f"  peak RSS of this process {usage.ru_maxrss / 2**20:6.2f} GB ({models})")
    from ragen import allocator

    print(f"  CPU time of this process {usage.ru_utime:7.1f} s user, {usage.ru_stime:.1f} s system (page faults "
          f"{usage.ru_minflt}); allocator tuned: {allocator.ALLOCATOR_TUNED} (RAGEN_TUNE_MALLOC=0 to compare)")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
