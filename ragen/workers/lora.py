"""LoRA on the policy (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3).

Each targeted linear layer computes ``W x + (alpha / r) * B A x`` with the base ``W`` frozen and only ``A``
(r x in) and ``B`` (out x r, initialised to zero, so training starts at the base model) trained. Adapters are
injected with ``peft.inject_adapter_in_model``, which rewrites the targeted ``nn.Linear`` modules in place: the
model keeps its class and module paths (``model.layers``, FSDP2 sharding and ``LogProbModel`` are unchanged), and
its state dict names a targeted weight ``<module>.base_layer.weight`` beside ``<module>.lora_A.default.weight`` and
``<module>.lora_B.default.weight``.

What LoRA buys the trainer:
  - the reference policy is the base model, i.e. the actor with its adapters switched off (``adapters_disabled``):
    no second model in memory, no second worker group;
  - AdamW moments for the adapters only, and no weight gradients for the frozen base;
  - the rollout engine receives merged weights (``merge_lora``: ``W + scale * B @ A``, transformers names), so it
    needs no LoRA support.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from ragen.workers.config import LORA_TARGETS

ADAPTER = "default"  # peft's adapter name
BASE = ".base_layer."
LORA_A, LORA_B = f".lora_A.{ADAPTER}.", f".lora_B.{ADAPTER}."
# in a subfolder: loaders that glob a model folder's *.safetensors (vLLM, ...) must not see the adapters
ADAPTER_FILE = "lora/adapter.safetensors"
# Every linear map of a Llama-style decoder layer (attention and MLP); the lm_head and embeddings stay full.
DEFAULT_TARGETS = LORA_TARGETS


def add_lora(model: nn.Module, rank: int, alpha: float, target_modules: Sequence[str] = DEFAULT_TARGETS,
             seed: int = 0) -> nn.Module:
    """Inject rank-``rank`` adapters (scale ``alpha / rank``) into the ``target_modules`` linears of ``model`` in
    place and freeze every other parameter. ``A`` is drawn from torch's RNG seeded with ``seed`` (Kaiming uniform,
    peft's default), ``B`` is zero: the model's outputs are unchanged until the first update. Returns ``model``."""
    from peft import LoraConfig, inject_adapter_in_model

    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = sorted(set(target_modules) - names)
    if missing:
        raise ValueError(f"actor.lora_target_modules names {missing}, which are not linear layers of "
                         f"{type(model).__name__}; its linear layers are {sorted(names)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=0.0,
                            bias="none")
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_key(name))
    return model


def initial_adapters(model: nn.Module, rank: int, alpha: float, target_modules: Sequence[str] = DEFAULT_TARGETS,
                     seed: int = 0) -> dict[str, torch.Tensor]:
    """The adapter weights (fp32, CPU, names as in ``model``'s state dict after ``add_lora``) that ``add_lora(model,
    rank, alpha, target_modules, seed)`` gives a plain fp32 model of ``model``'s architecture, computed without any
    base weight: for a ``model`` on the meta device, whose own adapters ``add_lora`` leaves uninitialised.

    peft's injection itself runs, on a copy of ``model`` whose linear weights are zero-stride CPU stand-ins: peft
    creates each adapter on the CPU, draws it from the seeded RNG in module order and then moves it to its base
    weight's device (here the CPU), so the draws, and the values, are those of the plain build bit for bit."""
    skeleton = copy.deepcopy(model)
    for module in skeleton.modules():
        if isinstance(module, nn.Linear):
            stand_in = torch.zeros((), dtype=torch.float32).expand(module.weight.shape)
            module.weight = nn.Parameter(stand_in, requires_grad=False)
    add_lora(skeleton, rank, alpha, target_modules, seed=seed)
    return adapter_state(skeleton.state_dict())


def is_adapter_key(name: str) -> bool:
    """True for the parameters LoRA trains (``lora_A`` / ``lora_B``)."""
    return LORA_A in name or LORA_B in name


def has_lora(model: nn.Module) -> bool:
    return any(is_adapter_key(n) for n, _ in model.named_parameters())


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its frozen base (every adapter off): the reference policy of a LoRA actor."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)


def merge_lora(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The plain model's state dict from a LoRA model's: ``<m>.weight = W + scale * B @ A`` for every adapted
    module ``<m>`` (``W`` = ``<m>.base_layer.weight``), other keys unchanged, adapter keys dropped. ``scale`` =
    alpha / rank. Computed in fp32 and returned in ``W``'s dtype; a state dict without adapters is returned as is."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if is_adapter_key(key):
            continue
        if BASE not in key:
            out[key] = value
            continue
        prefix, leaf = key.split(BASE)
        a, b = state.get(f"{prefix}{LORA_A}{leaf}"), state.get(f"{prefix}{LORA_B}{leaf}")
        merged = value
        if leaf == "weight" and a is not None and b is not None:
            merged = merge_weight(value, a, b, scale)
        out[f"{prefix}.{leaf}"] = merged
    return out


def merge_weight(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``W + scale * B @ A`` in fp32, returned in ``W``'s dtype. W: (out, in), B: (out, r), A: (r, in); rows of W
    with the same rows of B give the same rows of the result (a rank's shard of a merged weight)."""
    return (w.float() + scale * (b.float() @ a.float())).to(w.dtype)


def adapter_names(base_name: str) -> tuple[str, str] | None:
    """(A's name, B's name) of the adapters of a LoRA base weight's name (``<m>.base_layer.weight``), else None."""
    if BASE not in base_name or not base_name.endswith(f"{BASE}weight"):
        return None
    prefix = base_name[:-len(f"{BASE}weight")]
    return f"{prefix}{LORA_A}weight", f"{prefix}{LORA_B}weight"


def plain_name(name: str) -> str:
    """A LoRA model's name in the plain model (``<m>.base_layer.<leaf>`` -> ``<m>.<leaf>``; others unchanged)."""
    return name.replace(BASE, ".")


def lora_module(key: str) -> str | None:
    """The adapted module a LoRA state-dict key belongs to (``<m>`` of ``<m>.base_layer.*`` / ``<m>.lora_A.*`` /
    ``<m>.lora_B.*``), None for any other key."""
    for part in (BASE, LORA_A, LORA_B):
        if part in key:
            return key.split(part)[0]
    return None


def merge_lora_stream(items: Iterable[tuple[str, torch.Tensor]], scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """``merge_lora`` over (name, tensor) pairs in state-dict order, lazily: the entries of one adapted module (its
    base layer and adapters, consecutive in a state dict) are collected and merged together, every other entry passes
    through as it arrives, so at most one module's tensors are held at a time (a weight sync gathers one tensor at a
    time). Yields what ``merge_lora`` of the whole dict holds, in the same order."""
    pending: dict[str, torch.Tensor] = {}
    owner: str | None = None
    for key, value in items:
        module = lora_module(key)
        if pending and module != owner:
            yield from merge_lora(pending, scale).items()
            pending = {}
        owner = module
        if module is None:
            yield key, value
        else:
            pending[key] = value
    if pending:
        yield from merge_lora(pending, scale).items()


def to_lora_keys(state: dict[str, torch.Tensor], model_keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """Rename a plain state dict's keys to a LoRA model's (``<m>.weight`` -> ``<m>.base_layer.weight`` where the
    model has that key), so a plain checkpoint loads as the frozen base. Adapter keys are not produced."""
    wanted = set(model_keys)
    out = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        lora_key = f"{prefix}{BASE}{leaf}"
        out[lora_key if lora_key in wanted else key] = value
    return out


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter entries of a state dict (what a LoRA checkpoint must keep besides the base model)."""
    return {k: v for k, v in state.items() if is_adapter_key(k)}
