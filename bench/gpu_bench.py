"""GPU benchmarks, each a ratio measured in one run, on models built from a config with random weights.

    python bench/gpu_bench.py train --out train.json        # 0.5B and 3B shapes, 8 rows x 4096 tokens, bf16
    python bench/gpu_bench.py generate --out generate.json  # 0.5B shape, 64 prompts x 512 tokens, 128 new tokens
    python bench/gpu_bench.py train --device cpu --tiny     # smoke mode: tiny shapes, seconds on a CPU

``train``: ours = ``PolicyWorker.update`` (in-process, world size 1: the path of a one-GPU run; bf16 autocast, fp32
master weights, chunked log-probs, PPO loss, grad clip, AdamW) against a bare torch loop on the same batch (plain
forward under the same autocast, full log_softmax, the same clipped loss, backward, clip, AdamW); the ratio is
bare time / our time (goal >= 0.9). Model FLOP utilisation of our update = (6 N tokens + attention FLOPs) / time /
peak (``train_flops``; recomputation, e.g. of the lm_head chunks, is not counted), against the GPU's dense bf16
spec (H100 / H200: 989 TFLOP/s) and against a large bf16 GEMM measured in the same run; goal >= 40% for the 3B
shape at 4k-token rows. Every row is response but its first token, so both loops run the lm_head on every token,
as 6 N tokens counts.
``generate``: the hf engine (``ragen.rollout.hf.HFEngine``: our decode loop with KV cache) against transformers'
``model.generate`` on the same prompts, greedy, every row decoding ``--new-tokens`` tokens (no eos); ratio = bare
time / our time (goal >= 0.9); then the engine's sleep / wake memory.
Both report the peak memory of each phase (CUDA: ``torch.cuda.max_memory_allocated`` reset per phase; CPU: the
process's peak RSS so far) and keep to ``--budget-s``: after one warm-up, timed repeats stop when the budget is
spent (at least one); the best repeat is the estimate. ``--out`` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

SPEC_BF16_TFLOPS = {"H200": 989.0, "H100 80GB HBM3": 989.0}  # dense bf16, SXM (NVIDIA data sheets)
# name -> Qwen2 config fields (Qwen2.5-0.5B / -3B shapes: grouped-query attention, tied embeddings)
SHAPES = {
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "vocab_size": 151936},
    "3b": {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
           "intermediate_size": 11008, "vocab_size": 151936},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 512},
}
GOAL_RATIO, GOAL_MFU, MFU_GOAL_SHAPE = 0.9, 0.40, "3b"


def train_flops(matmul_params: int, layers: int, heads: int, head_dim: int, rows: int, seq_len: int) -> float:
    """Model FLOPs of one training step (forward + backward) over ``rows`` rows of ``seq_len`` tokens.

    6 N per token for the weights (N = ``matmul_params``, the weights of every matrix product, lm_head included,
    the embedding lookup not) plus causal self-attention: per layer and row the forward computes Q K^T and A V over
    the T^2 / 2 visible pairs, 2 * (head_dim * T^2 / 2) * 2 FLOPs per head, and the backward twice that, so
    6 * layers * heads * head_dim * T per token (half of PaLM's 12 L H Q T, Chowdhery et al. 2022, appendix B,
    which counts all T^2 pairs). Recomputation is not counted.
    """
    tokens = rows * seq_len
    return 6.0 * matmul_params * tokens + 6.0 * layers * heads * head_dim * seq_len * tokens


def matmul_params(model: torch.nn.Module) -> int:
    """Weights that enter a matrix product per token: every 2-D parameter but the input embedding, plus the output
    projection once (tied to the embedding or not). Biases and norms are left out (< 0.1% of the FLOPs)."""
    emb, out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not emb and p is not out) + out.numel()


def build_model(shape: str, device: str, seed: int = 0) -> torch.nn.Module:
    """A Qwen2 causal LM of ``shape`` with random weights, fp32, built directly on ``device``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6,
                      pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: a 3B model's random init on CPU takes minutes
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    model.to(device)  # a no-op unless from_config ignored the device context
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> tuple[object, float]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def repeat_within(budget_s: float, max_repeats: int, *fns: Callable[[], object], device: str) -> list[list[float]]:
    """One warm-up call of each ``fn``, then rounds of one timed call each (alternating, so drifting clocks or load
    hit all alike) until ``max_repeats`` rounds or ``budget_s`` seconds; each fn's list of timed seconds."""
    for fn in fns:
        timed(fn, device)
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < max_repeats and (not times[0] or time.perf_counter() - start < budget_s):
        for i, fn in enumerate(fns):
            times[i].append(timed(fn, device)[1])
    return times


class PhaseMemory:
    """Peak memory of named phases: CUDA ``max_memory_allocated`` (reset at each phase start), else process RSS."""

    def __init__(self, device: str):
        self.device, self.gib = device, {}

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        yield
        if self.device == "cuda":
            self.gib[name] = torch.cuda.max_memory_allocated() / 2**30
        else:
            from ragen.utils.memory import peak_rss_gb

            self.gib[name] = peak_rss_gb()


def free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def gemm_tflops(device: str, size: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """Best measured throughput of a ``size``-square matmul in ``dtype`` on ``device``, in TFLOP/s."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    best = min(timed(lambda: a @ b, device)[1] for _ in range(repeats + 1))
    return 2.0 * size**3 / best / 1e12


def gpu_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def spec_tflops(name: str) -> float | None:
    """The dense bf16 spec of a known GPU name (None when unknown: MFU is then reported against the GEMM only)."""
    return next((v for k, v in SPEC_BF16_TFLOPS.items() if k in name), None)


# ---------------------------------------------------------------------------------------------- train
def make_batch(rows: int, seq_len: int, vocab: int, seed: int = 0):
    """Random ids, no padding, every token but the first a response token, random advantages."""
    from ragen.workers import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, seq_len), generator=g)
    resp = torch.ones(rows, seq_len, dtype=torch.long)
    resp[:, 0] = 0
    return TrainBatch(ids, torch.ones_like(ids), resp, advantages=torch.randn(rows, seq_len, generator=g) * resp)


def bare_step(model, opt, batch, micro: int, device: str, bf16: bool, clip: float = 0.2) -> float:
    """One plain PPO training step: full logits, log_softmax, clipped token-mean loss, grad clip 1, AdamW."""
    n_tok = float(batch.response_mask[:, 1:].sum())
    for part in batch.chunk(micro):
        part = part.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=part.input_ids, attention_mask=part.attention_mask).logits
        lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, part.input_ids[:, 1:, None]).squeeze(-1)
        mask = part.response_mask[:, 1:].float()
        adv, old = part.advantages[:, 1:], part.old_log_probs[:, 1:]
        ratio = torch.exp(lp - old)
        loss_mat = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
        ((loss_mat * mask).sum() / n_tok).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(norm)


def policy_worker(model, cfg):
    """A ``PolicyWorker`` holding ``model``'s weights: the worker builds its LM on the meta device and reads the
    weights through ``ragen.workers.materialize.open_model``, swapped here for one that reads them from ``model``."""
    import ragen.workers.actor as actor
    import ragen.workers.materialize as M
    from ragen.models.meta import empty_from_config
    from ragen.models.weights import MemoryReader

    def from_memory(name, tiny, cache_dir, dtype=torch.float32, attn_implementation=None):
        return (empty_from_config(model.config, dtype, attn_implementation=attn_implementation),
                MemoryReader(model.state_dict()))

    saved = M.open_model
    M.open_model = from_memory
    try:
        return actor.PolicyWorker("random-weights", cfg)
    finally:
        M.open_model = saved


def time_ours(shape: str, cfg, batch, args, mem: PhaseMemory):
    """(batch with old log-probs, timed seconds of our update, ``matmul_params``) on a fresh model of ``shape``."""
    with mem.phase("init"):
        model = build_model(shape, args.device)
        worker = policy_worker(model, cfg)
    n = matmul_params(model)
    del model  # the worker holds its own copy of the weights
    with mem.phase("old_log_probs"):
        batch = batch.with_fields(old_log_probs=worker.compute_log_probs(batch))
    with mem.phase("actor_update"):
        (times,) = repeat_within(args.budget_s / 2, args.repeats, lambda: worker.update(batch), device=args.device)
    return batch, times, n


def time_bare(shape: str, batch, args, bf16: bool, mem: PhaseMemory) -> list[float]:
    """Timed seconds of the bare loop on a fresh model of ``shape`` (the same seed: the same weights as ours)."""
    model = build_model(shape, args.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, foreach=True)
    with mem.phase("bare_update"):
        (times,) = repeat_within(args.budget_s / 2, args.repeats,
                                 lambda: bare_step(model, opt, batch, args.micro, args.device, bf16),
                                 device=args.device)
    return times


def bench_shape(shape: str, args, precision: str, peaks: dict) -> dict:
    """Ours against the bare loop on one shape: times, tokens/s, ratio, FLOPs, MFU and per-phase peak memory."""
    from ragen.workers import ActorConfig

    dev, mem, spec = args.device, PhaseMemory(args.device), SHAPES[shape]
    cfg = ActorConfig(lr=1e-6, mini_batch_size=args.rows, micro_batch_size=args.micro, mixed_precision=precision,
                      clip_high=0.2)
    batch, t_ours, n = time_ours(shape, cfg, make_batch(args.rows, args.seq_len, spec["vocab_size"]), args, mem)
    free(dev)
    heads, hidden = spec["num_attention_heads"], spec["hidden_size"]
    flops = train_flops(n, spec["num_hidden_layers"], heads, hidden // heads, args.rows, args.seq_len)
    t_bare = time_bare(shape, batch, args, precision == "bf16", mem)
    free(dev)
    tokens, ours_s, bare_s = args.rows * args.seq_len, min(t_ours), min(t_bare)
    out = {"matmul_params": n, "rows": args.rows, "seq_len": args.seq_len, "micro": args.micro,
           "precision": precision, "ours_update_s": ours_s, "bare_update_s": bare_s,
           "ours_tokens_per_s": tokens / ours_s, "bare_tokens_per_s": tokens / bare_s, "ratio": bare_s / ours_s,
           "goal_ratio": GOAL_RATIO, "flops_per_step": flops, "repeats": {"ours": len(t_ours), "bare": len(t_bare)},
           "peak_memory_gib": mem.gib}
    for key, peak in (("mfu_vs_spec", peaks["spec_tflops"]), ("mfu_vs_measured", peaks["measured_gemm_tflops"])):
        out[key] = flops / ours_s / (peak * 1e12) if peak else None
    if shape == MFU_GOAL_SHAPE:
        out["goal_mfu"] = GOAL_MFU
    return out


def run_train(args) -> dict:
    from ragen.utils.hardware import resolve_precision

    precision, why = resolve_precision(args.precision, torch.device(args.device))
    name = gpu_name(args.device)
    gemm_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    peaks = {"spec_tflops": spec_tflops(name), "measured_gemm_tflops": gemm_tflops(args.device, args.gemm_size,
                                                                                  gemm_dtype),
             "gemm": f"{args.gemm_size}^3 {str(gemm_dtype).split('.')[-1]}"}
    shapes = {s: bench_shape(s, args, precision, peaks) for s in args.shapes}
    return {"peak": peaks, "precision_reason": why, "shapes": shapes}


# ---------------------------------------------------------------------------------------------- generate
class IdTokenizer:
    """What ``HFEngine`` reads of a tokenizer when prompts are ids and nothing stops on text: pad, no eos."""

    pad_token_id, eos_token_id = 0, None

    def decode(self, ids, skip_special_tokens=False) -> str:
        return " ".join(map(str, ids))


def run_generate(args) -> dict:
    from ragen.rollout import SamplingParams
    from ragen.rollout.hf import HFEngine

    dev, mem = args.device, PhaseMemory(args.device)
    dtype = "bfloat16" if dev == "cuda" else "float32"
    shape = "tiny" if args.tiny else "0.5b"
    with mem.phase("engine_init"):
        engine = HFEngine(build_model(shape, dev), IdTokenizer(), device=dev, dtype=dtype,
                          batch_size=args.prompts)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, SHAPES[shape]["vocab_size"], (args.prompts, args.prompt_len), generator=g)
    prompts = ids.tolist()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    model = engine.model
    on_dev = ids.to(dev)

    def bare():
        with torch.inference_mode():
            return model.generate(input_ids=on_dev, attention_mask=torch.ones_like(on_dev), do_sample=False,
                                  max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=0)

    with mem.phase("generate"):
        t_ours, t_bare = repeat_within(args.budget_s, args.repeats, lambda: engine.generate(prompts, greedy), bare,
                                       device=dev)
    ours_ids = [s.token_ids for s in engine.generate(prompts, greedy)]
    bare_ids = bare()[:, args.prompt_len:].tolist()
    tokens, ours_s, bare_s = args.prompts * args.new_tokens, min(t_ours), min(t_bare)
    memory = sleep_wake_memory(engine, dev)
    return {"shape": shape, "dtype": dtype, "prompts": args.prompts, "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens, "ours_s": ours_s, "bare_s": bare_s, "ours_tokens_per_s": tokens / ours_s,
            "bare_tokens_per_s": tokens / bare_s, "ratio": bare_s / ours_s, "goal_ratio": GOAL_RATIO,
            "rows_equal_to_bare": sum(a == b for a, b in zip(ours_ids, bare_ids, strict=True)) / len(prompts),
            "all_rows_full_length": all(len(x) == args.new_tokens for x in ours_ids),
            "repeats": {"ours": len(t_ours), "bare": len(t_bare)}, "peak_memory_gib": mem.gib,
            "sleep_wake_gib": memory}


def sleep_wake_memory(engine, device: str) -> dict | None:
    """CUDA memory allocated with the engine awake, asleep and woken again (GiB); None on CPU."""
    if device != "cuda":
        return None
    sync(device)
    awake = torch.cuda.memory_allocated()
    engine.sleep()
    asleep = torch.cuda.memory_allocated()
    engine.wake()
    return {"awake": awake / 2**30, "asleep": asleep / 2**30, "woken": torch.cuda.memory_allocated() / 2**30}


# ---------------------------------------------------------------------------------------------- CLI
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", choices=("train", "generate"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="tiny shapes and sizes (CPU smoke mode; overrides sizes)")
    p.add_argument("--budget-s", type=float, default=60.0, help="seconds of timed repeats (train: per shape)")
    p.add_argument("--repeats", type=int, default=3, help="at most this many timed repeats after the warm-up")
    p.add_argument("--out", type=Path, default=None, help="write the figures to this JSON file")
    p.add_argument("--shapes", default="0.5b,3b", help="train: comma-separated shapes of SHAPES")
    p.add_argument("--rows", type=int, default=8, help="train: rows per update (one mini-batch)")
    p.add_argument("--seq-len", type=int, default=4096, help="train: tokens per row")
    p.add_argument("--micro", type=int, default=1, help="train: rows per micro-batch, both loops")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"), help="train: mixed precision")
    p.add_argument("--gemm-size", type=int, default=8192, help="train: side of the GEMM that measures the peak")
    p.add_argument("--prompts", type=int, default=64, help="generate: prompts per batch")
    p.add_argument("--prompt-len", type=int, default=512, help="generate: tokens per prompt")
    p.add_argument("--new-tokens", type=int, default=128, help="generate: tokens decoded per prompt")
    args = p.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        p.error(f"--shapes {unknown} unknown; use some of {sorted(SHAPES)}")
    if args.tiny:
        args.shapes, args.rows, args.seq_len, args.micro, args.gemm_size = ["tiny"], 4, 64, 2, 256
        args.prompts, args.prompt_len, args.new_tokens = 4, 16, 8
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device; use --device cpu --tiny for the smoke mode")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    started = time.perf_counter()
    figures = run_train(args) if args.bench == "train" else run_generate(args)
    result = {"bench": args.bench, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "device": args.device, "gpu": gpu_name(args.device), "torch": torch.__version__, "tiny": args.tiny,
              "seconds": time.perf_counter() - started, **figures}
    text = json.dumps(result, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
