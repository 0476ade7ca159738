"""Engine registry: one :class:`EngineEntry` per engine says everything the run layer needs to know about it.

``make_engine(name, **kwargs)`` builds one; backends are imported only when selected (vLLM needs its own build).
The config checks (``ragen.trainer.config.shared_checks``: which ``rollout.engine`` values a run accepts, which packages
must be importable), the builders (``ragen.trainer.builders.engine_spec``: the constructor's keyword arguments), the
worker that hosts an engine (``ragen.workers.engine_host``) and the rule that rejects an unused engine section
(``ragen.trainer.config.unread_keys``) read the entries, so a new engine is an entry here (:func:`register_engine`)
plus, when it has settings of its own, its section ``rollout.<section>`` in the schema.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragen.rollout.base import Engine


@dataclass(frozen=True)
class EngineContext:
    """What every engine of a run is built from, resolved by the builders: the policy's weights folder ``model``,
    its ``tokenizer``, the ``device`` (``cpu`` / ``cuda``) and weight ``dtype``; ``multi_turn``: some env of the run
    plays more than one turn; ``max_model_len`` (``agent.max_model_len``), ``seed`` (``trainer.seed``);
    ``own_gpus``: the engine runs on GPUs of its own (not shared with training)."""

    model: str
    tokenizer: Any
    device: str
    dtype: str
    multi_turn: bool = False
    max_model_len: int = 2048
    seed: int = 0
    own_gpus: bool = False


def _no_options(section: Any, ctx: EngineContext) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class EngineEntry:
    """One engine.

    ``target``: its class, or ``"module:Class"`` (imported when the engine is built). ``trains``: a training run may
    select it as ``rollout.engine`` (the openai engine only evaluates served models). ``section``: the name of its
    settings section ``rollout.<section>`` (None: none); set while another engine is selected, its keys change
    nothing and are refused. ``label``: how messages name it. ``options(section, ctx)``: the constructor's keyword
    arguments beyond ``model``, ``tokenizer``, ``device`` and ``dtype`` (``section``: the value of
    ``rollout.<section>``, None without one). ``packages``: modules it imports; a run with the engine needs them
    importable (``missing``: the message per device, ``cpu`` / ``cuda``, saying how to install them; a GPU run
    planned from a machine without CUDA is not refused). ``hosted``: an actor rank may host it in its own process
    (``ragen.workers.engine_host``), with its device as ``cuda:<i>`` (``device_index``) or ``cuda``.
    """

    name: str
    target: type | str
    trains: bool = True
    section: str | None = None
    label: str = ""
    options: Callable[[Any, EngineContext], dict[str, Any]] = _no_options
    packages: tuple[str, ...] = ()
    missing: dict[str, str] = field(default_factory=dict)
    hosted: bool = True
    device_index: bool = True

    def engine_class(self) -> type:
        if isinstance(self.target, str):
            module, cls = self.target.split(":")
            return getattr(importlib.import_module(module), cls)
        return self.target

    def kwargs(self, section: Any, ctx: EngineContext) -> dict[str, Any]:
        """The constructor's keyword arguments for a run whose context is ``ctx``."""
        return {"model": ctx.model, "tokenizer": ctx.tokenizer, "device": ctx.device, "dtype": ctx.dtype,
                **self.options(section, ctx)}


def _hf_options(section: Any, ctx: EngineContext) -> dict[str, Any]:
    """Keep each episode's KV cache from turn to turn only where an episode has a next turn."""
    return {"prefix_cache": ctx.multi_turn}


def _vllm_options(section: Any, ctx: EngineContext) -> dict[str, Any]:
    """``rollout.vllm``'s engine keys; sleep mode only on GPUs shared with training (where it frees memory)."""
    return {"gpu_memory_utilization": section.gpu_memory_utilization,
            "tensor_parallel_size": section.tensor_parallel_size, "enforce_eager": section.enforce_eager,
            "enable_sleep_mode": section.enable_sleep_mode and ctx.device == "cuda" and not ctx.own_gpus,
            "max_num_seqs": section.max_num_seqs, "max_model_len": ctx.max_model_len, "seed": ctx.seed}


_VLLM_MISSING = {
    "cpu": "rollout.engine=vllm on CPU needs the CPU build of vLLM: run `bash scripts/setup_vllm_env.sh` and launch "
           "after `source .venv-vllm/bin/activate` (or use rollout.engine=hf, or trainer=gpu on GPUs)",
    "cuda": "rollout.engine=vllm (trainer=gpu) needs vLLM, which is not installed in this environment: pip install "
            "-e .[gpu] (vllm==0.32.0, with the CUDA build of torch==2.13.0; docs/gpu.md), or use rollout.engine=hf",
}

_ENGINES: dict[str, EngineEntry] = {}


def register_engine(entry: EngineEntry) -> EngineEntry:
    """Add ``entry`` (replacing one of the same name) and return it."""
    _ENGINES[entry.name] = entry
    return entry


def unregister_engine(name: str) -> None:
    """Remove the engine ``name`` (tests that register one of their own)."""
    _ENGINES.pop(name, None)


register_engine(EngineEntry("hf", "ragen.rollout.hf:HFEngine", label="hf", options=_hf_options))
register_engine(EngineEntry("vllm", "ragen.rollout.vllm_engine:VLLMEngine", section="vllm", label="vLLM",
                            options=_vllm_options, packages=("vllm",), missing=_VLLM_MISSING, device_index=False))
register_engine(EngineEntry("openai", "ragen.rollout.openai_engine:OpenAIEngine", trains=False, label="openai",
                            hosted=False))


def engine_names() -> list[str]:
    """Names accepted by ``make_engine``."""
    return sorted(_ENGINES)


def training_engines() -> tuple[str, ...]:
    """Names a training run accepts as ``rollout.engine``, in registration order."""
    return tuple(name for name, entry in _ENGINES.items() if entry.trains)


def engine_entry(name: str) -> EngineEntry:
    """The entry registered under ``name``."""
    if name not in _ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid engines: {', '.join(engine_names())}")
    return _ENGINES[name]


def engine_entries() -> tuple[EngineEntry, ...]:
    """Every registered entry, in registration order."""
    return tuple(_ENGINES.values())


def engine_class(name: str) -> type:
    """The engine class registered under ``name`` (imports its module)."""
    return engine_entry(name).engine_class()


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine ``name`` ("hf", "vllm", "openai", or a registered one) with its constructor's keyword
    arguments."""
    return engine_class(name)(**kwargs)

