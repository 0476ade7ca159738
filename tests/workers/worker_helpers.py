"""Helpers of the worker tests: tiny random Llama models built from a config (no downloads), random batches
(``random_batch``: ``factories.random_rows``), and for the GPU twins the device placement, a sharded world of one
rank and a float64 CPU reference of log-probs.

Imported as ``from worker_helpers import ...`` (pytest puts this folder on ``sys.path``); fixtures live in
conftest.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from factories import VOCAB
from factories import random_rows as random_batch  # noqa: F401 - the worker tests' name
from transformers import LlamaConfig, LlamaForCausalLM


def make_lm(seed: int = 0, tied: bool = True, vocab: int = VOCAB) -> LlamaForCausalLM:
    """A 2-layer, hidden-32 Llama causal LM with random weights (fp32, CPU)."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)


@contextlib.contextmanager
def placed_on(device: str) -> Iterator[None]:
    """Workers constructed inside are placed on ``device``.

    ``init_distributed`` takes the first CUDA device whenever one is visible, so a CPU twin on a GPU machine is built
    with CUDA hidden (``torch.cuda.is_available`` answers False during construction); its later calls run on the
    device it stored. ``cuda`` changes nothing."""
    if device != "cpu":
        yield
        return
    saved = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = saved


@contextlib.contextmanager
def sharded_world_of_one(device: str) -> Iterator[None]:
    """A process group of one rank (nccl on ``cuda``, gloo on ``cpu``) under which workers take their sharded path:
    FSDP2 ``fully_shard`` of every layer and the root, DTensor gradient norms, all-reduces and gathered state dicts.

    Production shards from world size 2 on (``ragen.workers.dist.is_sharded``); one GPU cannot hold two NCCL ranks,
    so here ``is_sharded`` answers True while the group exists."""
    import socket

    import torch.distributed as dist

    from ragen.workers import dist as D

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    saved = D.is_sharded
    D.is_sharded = lambda: dist.is_initialized()
    try:
        yield
    finally:
        D.is_sharded = saved
        dist.destroy_process_group()


def reference_log_probs(model, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """(B, T) float64 log-probs of each token given the ones before it, from a float64 copy of ``model`` on CPU:
    ``out[:, t] = log softmax(logits[:, t - 1])[ids[:, t]]`` where tokens t - 1 and t are real, else 0. ``ids``,
    ``attn``: (B, T) right-padded."""
    import copy

    m = copy.deepcopy(model).to("cpu", torch.float64).eval()
    with torch.no_grad():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logp = torch.log_softmax(m(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1], dim=-1)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1) * (attn[:, 1:] * attn[:, :-1])
    return torch.cat([torch.zeros(ids.shape[0], 1, dtype=torch.float64), lp], dim=1)
