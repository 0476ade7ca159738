"""Inference engines behind one protocol (``Engine``); GPU backends are imported only when selected.

``make_engine("hf" | "vllm" | "openai", **kwargs)`` builds one; ``HFEngine`` is importable from here lazily.
"""

from ragen.rollout.base import Engine, Sample, SamplingParams
from ragen.rollout.registry import engine_names, make_engine

__all__ = ["Engine", "HFEngine", "Sample", "SamplingParams", "engine_names", "make_engine"]


def __getattr__(name: str):
    if name == "HFEngine":  # lazy: importing transformers is slow and not needed by every user of the protocol
        from ragen.rollout.hf import HFEngine

        return HFEngine
    raise AttributeError(f"module 'ragen.rollout' has no attribute {name!r}")
