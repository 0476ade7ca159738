"""Text environments behind one protocol, built by name: ``ragen.env.make("bandit", **config)``."""

from ragen.env.base import Env, StepResult, config_keys, has_expert, make, names, register, reports_step_split

__all__ = ["Env", "StepResult", "config_keys", "has_expert", "make", "names", "register", "reports_step_split"]
