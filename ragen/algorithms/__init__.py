"""ragen.algorithms: advantage estimators (one registry, one signature), PPO-family losses, masked statistics.

All functions are pure: tensors in, tensors out, explicit scalars (docs/design.md; every estimator's math:
docs/estimators.md).
"""

from ragen.algorithms.inputs import AdvantageInputs
from ragen.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    EstimatorSpec,
    bind_estimator_args,
    compute_advantage,
    register_estimator,
)

__all__ = ["ADVANTAGE_ESTIMATORS", "AdvantageInputs", "EstimatorSpec", "bind_estimator_args", "compute_advantage",
           "register_estimator"]
