"""Time and peak memory of one log-prob pass over a packed micro-batch on CPU, per packing, under ``sdpa`` in fp32.

    python bench/attention_packing.py                      # default model, a group of 8 rows
    python bench/attention_packing.py --rows 4 --prompt 120 --min-resp 8 --max-resp 200
    python bench/attention_packing.py --tiny               # the tiny random model (seconds)

The micro-batch is one episode group: ``--rows`` rows repeating one prompt of ``--prompt`` tokens, each with its own
response length (evenly spread over ``--min-resp``..``--max-resp``), right-padded. Each packing runs in a fresh
process (so one's freed memory cannot hide another's peak), loads the model, then runs ``token_log_probs`` (no grad):

- ``padded``: the (B, T) batch unpacked (fused causal kernel, no mask);
- ``4d-mask``: shared-prefix packing with our dense 4D mask (``ragen.models.packing``: the prompt once);
- ``position-id``: every row's real tokens concatenated, positions restarting per row, no mask passed: transformers
  builds the block-causal mask itself from the position ids (the layout ``flash_attention_2`` runs);
- ``flat-4d-mask``: the position-id layout with a dense 4D block-causal mask built by us (isolates who builds the
  mask from what the layout costs).

Peak memory is the process's peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs`` after loading) above its RSS
before the first pass; time is the best of ``--repeats`` passes after that one. Prints each packing's tokens, time and
peak, the ratios to ``4d-mask``, and the largest log-prob difference to ``padded``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKINGS = ("padded", "4d-mask", "position-id", "flat-4d-mask")


def make_batch(rows: int, prompt: int, min_resp: int, max_resp: int, vocab: int, seed: int = 0):
    """(input_ids, attention_mask, response_mask), all (rows, prompt + max response): one prompt, ragged responses."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = torch.linspace(min_resp, max_resp, rows).round().long().tolist()
    T = prompt + max(lens)
    ids = torch.zeros(rows, T, dtype=torch.long)
    attn = torch.zeros_like(ids)
    shared = torch.randint(3, vocab, (prompt,), generator=g)
    for i, n in enumerate(lens):
        ids[i, :prompt] = shared
        ids[i, prompt:prompt + n] = torch.randint(3, vocab, (n,), generator=g)
        attn[i, :prompt + n] = 1
    resp = attn.clone()
    resp[:, :prompt] = 0
    return ids, attn, resp


def _flat_mask_pass(lm, ids, attn, resp):
    """Log-probs over the position-id layout with our own dense block-causal 4D mask."""
    import torch

    from ragen.models.forward import causal_lm_parts
    from ragen.models.packing import plan_position_packing, unpack
    from ragen.workers.logprob import _predicted, log_probs_from_hidden

    base, head = causal_lm_parts(lm)
    plan = plan_position_packing(ids, attn)
    L = plan.ids.shape[1]
    row = torch.repeat_interleave(torch.arange(len(plan.cu_seqlens) - 1), plan.cu_seqlens.diff().long())
    q = torch.arange(L)
    mask = ((q[None, :] <= q[:, None]) & (row[None, :] == row[:, None]))[None, None]
    out = base(input_ids=plan.ids, attention_mask=mask, position_ids=plan.positions, use_cache=False)
    hidden = unpack(out.last_hidden_state, plan)
    return log_probs_from_hidden(head, hidden, ids, _predicted(attn, resp))[0]


def _packed_tokens(packing: str, ids, attn) -> int:
    from ragen.models.packing import plan_position_packing, plan_prefix_packing

    if packing == "padded":
        return ids.numel()
    plan = plan_prefix_packing(ids, attn) if packing == "4d-mask" else plan_position_packing(ids, attn)
    assert plan is not None, f"{packing}: the batch does not pack; raise --prompt or the response spread"
    return plan.ids.shape[1]


def _rss_kb(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def child(args: argparse.Namespace) -> None:
    """One packing in this process: JSON {tokens, time_s, peak_mb} on stdout, log-probs to ``args.out``."""
    import torch

    import ragen.models.forward as forward
    import ragen.models.packing as packing
    from ragen.models import load_model, tiny_model
    from ragen.workers.logprob import token_log_probs

    torch.set_num_threads(args.threads)
    lm = tiny_model(seed=0) if args.tiny else load_model(dtype=torch.float32)
    lm.config._attn_implementation = "sdpa"
    lm.eval()
    ids, attn, resp = make_batch(args.rows, args.prompt, args.min_resp, args.max_resp, lm.config.vocab_size)
    if args.child == "padded":
        forward.plan_packing = lambda *a: None
    elif args.child == "position-id":
        packing.PACKING_BY_ATTENTION["sdpa"] = packing.POSITION_IDS

    def one_pass():
        with torch.no_grad():
            if args.child == "flat-4d-mask":
                return _flat_mask_pass(lm, ids, attn, resp)
            return token_log_probs(lm, ids, attn, target_mask=resp)[0]

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _rss_kb("VmRSS")
    lp = one_pass()
    peak_mb = (_rss_kb("VmHWM") - before) / 1024
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - start)
    torch.save(lp, args.out)
    print(json.dumps({"tokens": _packed_tokens(args.child, ids, attn), "time_s": min(times), "peak_mb": peak_mb}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=150)
    p.add_argument("--min-resp", type=int, default=16)
    p.add_argument("--max-resp", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count())
    p.add_argument("--tiny", action="store_true", help="the tiny random model instead of the default 135M model")
    p.add_argument("--child", choices=PACKINGS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    import torch

    results, lps = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for name in PACKINGS:
            out = Path(folder) / f"{name}.pt"
            cmd = [sys.executable, __file__, "--child", name, "--out", str(out)] + sys.argv[1:]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            lps[name] = torch.load(out)
    ref = results["4d-mask"]
    print(f"sdpa, fp32, {args.rows} rows, prompt {args.prompt}, responses {args.min_resp}..{args.max_resp}, "
          f"{'tiny' if args.tiny else 'default'} model, {args.threads} thread(s)")
    print(f"{'packing':<14}{'tokens':>8}{'time s':>9}{'peak MB':>9}{'time/4d':>9}{'peak/4d':>9}{'max|dlp|':>10}")
    for name, r in results.items():
        diff = float((lps[name] - lps["padded"]).abs().max())
        print(f"{name:<14}{r['tokens']:>8}{r['time_s']:>9.3f}{r['peak_mb']:>9.1f}{r['time_s'] / ref['time_s']:>9.2f}"
              f"{r['peak_mb'] / max(ref['peak_mb'], 1e-9):>9.2f}{diff:>10.2e}")


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    main()
