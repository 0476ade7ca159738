"""Inference engines behind one protocol (``Engine``); GPU backends are imported only when selected."""

from ragen.rollout.base import Engine, Sample, SamplingParams

__all__ = ["Engine", "Sample", "SamplingParams"]
