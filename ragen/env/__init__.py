"""Text environments behind one protocol, built by name: ``ragen.env.make("bandit", **config)``."""

from ragen.env.base import (
    Env,
    StepResult,
    config_keys,
    default_config,
    has_action_list,
    has_expert,
    is_program,
    make,
    missing_extras,
    names,
    plugin_names,
    register,
    reports_step_split,
)

__all__ = ["Env", "StepResult", "config_keys", "default_config", "has_action_list", "has_expert", "is_program", "make",
           "missing_extras", "names", "plugin_names", "register", "reports_step_split"]
