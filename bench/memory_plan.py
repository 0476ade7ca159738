"""The memory plan's update terms (``ragen.trainer.config.memory_plan``) against measured peaks on this CPU.

    python bench/memory_plan.py            # every case, one fresh process at a time (each stays under ~4 GB)
    python bench/memory_plan.py --case smollm-2x512      # one case

Each case runs ``PolicyWorker.update`` (world size 1, ``actor.mixed_precision=auto``: bf16 autocast on a CPU with
native bf16, fp32 elsewhere) on a mini-batch of two micro-batches of random rows, in a fresh process: one update to
allocate the AdamW state, then the heap is trimmed, the peak RSS reset (``/proc/self/clear_refs``) and a second
update measured: peak RSS during it minus RSS before it. The second micro-batch runs with the first one's gradients
alive, as in every update with gradient accumulation. Rows are ``T`` tokens, the response (whose log-probs the loss
reads, so the logit chunks) their second half.

Predicted = the plan's update terms for that micro-batch: gradients (4 B x trained params), autocast's bf16 copy of
the weights (world size 1), activations, logits of the selected tokens. The difference is what no term models (the
allocator's slack, small buffers). Differences between cases of one model give the calibrated constants: the tiny
model (its memory is its logits) the bytes per logit entry, SmolLM2-135M without checkpointing the per-layer
activation factor, with checkpointing the stored layer inputs.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

GIB = 2**30
# name -> (model: tiny | smollm, rows per micro-batch, tokens per row, gradient checkpointing)
CASES = {
    "tiny-4x256": ("tiny", 4, 256, False),
    "tiny-4x512": ("tiny", 4, 512, False),
    "smollm-1x512": ("smollm", 1, 512, False),
    "smollm-2x512": ("smollm", 2, 512, False),
    "smollm-2x512-ckpt": ("smollm", 2, 512, True),
    "smollm-3x512-ckpt": ("smollm", 3, 512, True),
}
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4}
SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")


def _peak_reset() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM, the peak RSS (Linux)


def _peak_gib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / GIB
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(model: str, rows: int, seq_len: int, checkpointing: bool) -> dict:
    """Peak RSS of the second of two updates minus the RSS before it, and the shapes the prediction needs."""
    import torch
    from train_step import make_batch  # bench/ is on sys.path when run as a script

    from ragen.models import DEFAULT_MODEL
    from ragen.utils.hardware import resolve_precision
    from ragen.utils.memory import release_free_memory, rss_gb
    from ragen.workers import ActorConfig, PolicyWorker

    torch.set_num_threads(2)
    precision = resolve_precision("auto", "cpu")[0]
    cfg = ActorConfig(lr=1e-6, mini_batch_size=2 * rows, micro_batch_size=rows, gradient_checkpointing=checkpointing,
                      mixed_precision=precision)
    worker = PolicyWorker(DEFAULT_MODEL, cfg, tiny=TINY if model == "tiny" else None)
    batch = make_batch(2 * rows, seq_len, worker.config.vocab_size)
    batch = batch.with_fields(old_log_probs=worker.compute_log_probs(batch))
    worker.update(batch)  # allocates the AdamW moments
    gc.collect()
    release_free_memory()
    before = rss_gb()
    _peak_reset()
    worker.update(batch)
    c = worker.config
    return {"measured": _peak_gib() - before, "precision": precision,
            "config": {k: getattr(c, k, None) for k in SHAPE_KEYS}}


def predict(result: dict, rows: int, seq_len: int, checkpointing: bool) -> dict[str, float]:
    """The plan's update terms (GiB) for one micro-batch of this case."""
    from types import SimpleNamespace

    from ragen.models.shape import model_shape
    from ragen.trainer.config import memory_plan as M

    shape = model_shape(SimpleNamespace(**result["config"]))
    cb = 2 if result["precision"] == "bf16" else 4
    role = M.RoleLoad(shape.params, shape.params, 1, rows, rows, checkpointing, cb)
    selected = rows * (seq_len - seq_len // 2)
    return {"gradients": M.GRAD_BYTES * shape.params / GIB, "autocast copy": M.gathered_bytes(shape, role, True) / GIB,
            "activations": M.activation_bytes(shape, role, seq_len) / GIB,
            "logits": M.logit_bytes(shape, selected, 1024, grad=True, recompute=True) / GIB}


def run_case(name: str) -> dict:
    """``name`` in a fresh process (this script with ``--one``), its measurement and prediction."""
    out = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    _, rows, seq_len, ckpt = CASES[name]
    result["terms"] = predict(result, rows, seq_len, ckpt)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), action="append", help="run only these cases")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the measuring process of one case
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(*CASES[args.one])), flush=True)
        return
    results = {}
    for name in args.case or CASES:
        r = results[name] = run_case(name)
        predicted = sum(r["terms"].values())
        terms = ", ".join(f"{k} {v:.3f}" for k, v in r["terms"].items())
        print(f"{name:<18} {r['precision']}: measured {r['measured']:.3f} GiB, predicted {predicted:.3f} ({terms}); "
              f"unmodelled {r['measured'] - predicted:+.3f}", flush=True)
    _slopes(results)


def _slopes(results: dict) -> None:
    """The calibration: per-case differences that cancel what no term models."""
    from ragen.trainer.config import memory_plan as M

    if {"tiny-4x256", "tiny-4x512"} <= set(results):
        entries = 4 * 128 * results["tiny-4x512"]["config"]["vocab_size"]  # 512 more selected tokens
        extra = results["tiny-4x512"]["measured"] - results["tiny-4x256"]["measured"]
        print(f"logits: {extra * GIB / entries:.1f} bytes per logit entry measured (plan: {M.LOGIT_BYTES_GRAD})")
    if {"smollm-1x512", "smollm-2x512"} <= set(results):
        c = results["smollm-2x512"]["config"]
        extra = results["smollm-2x512"]["measured"] - results["smollm-1x512"]["measured"]
        logits = results["smollm-2x512"]["terms"]["logits"] - results["smollm-1x512"]["terms"]["logits"]
        per = (extra - logits) * GIB / (512 * c["num_hidden_layers"])  # bytes per token and layer
        count = 30 * c["hidden_size"] + 8 * c["intermediate_size"]  # (13 h + 4 i) x 2 B + 4 h (fp32 residual)
        print(f"activations: {per / c['hidden_size']:.1f} bytes per token, layer and hidden unit measured = "
              f"{per / count:.2f} x the structural count (plan: ACTIVATION_FACTOR {M.ACTIVATION_FACTOR})")
    if {"smollm-2x512-ckpt", "smollm-3x512-ckpt"} <= set(results):
        c = results["smollm-3x512-ckpt"]["config"]
        extra = results["smollm-3x512-ckpt"]["measured"] - results["smollm-2x512-ckpt"]["measured"]
        logits = results["smollm-3x512-ckpt"]["terms"]["logits"] - results["smollm-2x512-ckpt"]["terms"]["logits"]
        one_layer = 512 * M.ACTIVATION_FACTOR * (30 * c["hidden_size"] + 8 * c["intermediate_size"]) / GIB
        kept = (extra - logits - one_layer) * GIB / (512 * c["num_hidden_layers"] * c["hidden_size"] * 4)
        print(f"checkpointing: each layer keeps {kept:.1f} x its fp32 input per token, measured (plan: "
              f"CHECKPOINT_FACTOR {M.CHECKPOINT_FACTOR:g})")

if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
