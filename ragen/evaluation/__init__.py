"""Evaluation of trained policies and API models on fixed env seeds (``python -m ragen.eval``).

``models``: model arguments -> :class:`ModelSpec`; ``runner``: configs, engines and rollouts on seeds
``rollout.val_seed + i``; ``stats``: confidence intervals (pure functions); ``report``: metrics, the two-model
comparison, the console table and the JSON report; ``cli``: the command line.
"""

from ragen.evaluation.models import ModelArgError, ModelSpec, resolve_model_arg, resolve_model_args
from ragen.evaluation.runner import EpisodeResult, evaluate_env
from ragen.evaluation.stats import (
    Interval,
    mean_interval,
    newcombe_difference,
    paired_difference,
    wilson_interval,
)

__all__ = [
    "EpisodeResult", "Interval", "ModelArgError", "ModelSpec", "evaluate_env", "mean_interval",
    "newcombe_difference", "paired_difference", "resolve_model_arg", "resolve_model_args", "wilson_interval",
]
