"""Engine registry: ``make_engine(name, **kwargs)``; backends are imported only when selected (vLLM needs a GPU)."""

from __future__ import annotations

import importlib
from typing import Any

from ragen.rollout.base import Engine

# name -> "module:class"
_ENGINES: dict[str, str] = {
    "hf": "ragen.rollout.hf:HFEngine",
    "vllm": "ragen.rollout.vllm_engine:VLLMEngine",
    "openai": "ragen.rollout.openai_engine:OpenAIEngine",
}


def engine_names() -> list[str]:
    """Names accepted by ``make_engine``."""
    return sorted(_ENGINES)


def engine_class(name: str) -> type:
    """The engine class registered under ``name`` (imports its module)."""
    if name not in _ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid engines: {', '.join(engine_names())}")
    module, cls = _ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine ``name`` ("hf", "vllm", "openai") with its constructor keyword arguments."""
    return engine_class(name)(**kwargs)
