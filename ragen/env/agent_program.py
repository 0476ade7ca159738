"""``env=agent_program``: the user's own agent program as the environment (docs/gateway.md, "Training a program").

This is the config of a program run, not an env that is stepped: ``env.config.entry`` names a callable
``entry(base_url, api_key, task, seed) -> reward`` (sync or async) that talks to an OpenAI-compatible endpoint
with any client. The trainer runs one program per episode against the gateway (``ragen.agent.program_rollout``)
instead of stepping an env. Registering it here gives the config its file (``config/env/agent_program.yaml``), its
keys and their checks: building it (``ragen.env.make``, which the config checks do) imports the entry and the task
source, so a bad one fails before anything starts, naming the key, the value and the fix.

Tasks: ``tasks`` (a list: episode group ``g`` with seed ``s`` gets ``tasks[s % len(tasks)]``), else ``tasks_entry``
(``module:function``, called with the seed), else None (the program derives its task from the seed). The episodes
of one group share the task and the seed.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from ragen.env.base import StepResult, register

PROGRAM_ENV = "agent_program"


def load_entry(spec: Any, key: str) -> Callable[..., Any]:
    """The callable ``module:function`` names (``function`` may be dotted: ``module:Class.method``); a ValueError
    names the config ``key``, the value and the fix."""
    fix = (f"set {key}=<module>:<function>, a module importable from the run (installed, on PYTHONPATH, or listed in "
           "`imports`) and a callable in it")
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"{key}={spec!r} is not of the form module:function; {fix}")
    module_name, attr = spec.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure of the user's module is this config's problem
        raise ValueError(f"{key}={spec!r}: module {module_name!r} cannot be imported ({type(exc).__name__}: "
                         f"{exc}); {fix}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}={spec!r}: {module_name!r} has no attribute {attr!r}; {fix}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{key}={spec!r}: {attr!r} is a {type(obj).__name__}, not callable; {fix}")
    return obj


@register(PROGRAM_ENV)
class AgentProgram:
    """The program run's config (module docstring); checked when built. ``timeout_s``: each program run's time
    limit (past it the episode fails and trains nothing); ``tool_parser``: how the model's tool calls are read
    (``hermes``: ``<tool_call>{json}</tool_call>``, Hermes / Qwen2.5 / Qwen3; ``none``); ``model``: the model name
    the endpoint serves (the program's requests must name it); ``format_penalty``: added to the reward of each call
    whose completion was a malformed tool call (a number <= 0; the env proxy's ``agent.format_penalty`` default);
    ``expert``: ``module:function``, ``expert(prompt_text) -> answer_text``, the demonstrations of a warm start
    (``trainer.sft_warmup_steps``; ``ragen.gateway.expert``), or None."""

    PROGRAM = True  # run by the program driver, never stepped (``ragen.env.base.is_program``)
    DEFAULT_MAX_TURN = 3  # the calls per episode the run plan and memory checks assume
    instructions = ""

    def __init__(self, entry: str, tasks: list | None = None, tasks_entry: str | None = None,
                 timeout_s: float = 120.0, tool_parser: str = "hermes", model: str = "ragen",
                 format_penalty: float = -0.1, expert: str | None = None) -> None:
        self.entry = load_entry(entry, "env.config.entry")
        if tasks is not None and (isinstance(tasks, str | bytes) or not hasattr(tasks, "__len__") or not len(tasks)):
            raise ValueError(f"env.config.tasks={tasks!r} must be a non-empty list of tasks (or null: tasks_entry, "
                             "else the program derives its task from the seed)")
        if tasks is not None and tasks_entry is not None:
            raise ValueError(f"env.config.tasks and env.config.tasks_entry={tasks_entry!r} are both set; set one "
                             "(the other null)")
        self.tasks = list(tasks) if tasks is not None else None
        self.tasks_entry = load_entry(tasks_entry, "env.config.tasks_entry") if tasks_entry is not None else None
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"env.config.timeout_s={timeout_s!r} must be a number of seconds > 0 (each program run's "
                             "time limit)")
        if not isinstance(model, str) or not model:
            raise ValueError(f"env.config.model={model!r} must be a non-empty name (the model the endpoint serves)")
        if isinstance(format_penalty, bool) or not isinstance(format_penalty, int | float) or not (
                -math.inf < format_penalty <= 0):
            raise ValueError(f"env.config.format_penalty={format_penalty!r} must be a finite number <= 0 (added to the "
                             "reward of each malformed tool call); set e.g. env.config.format_penalty=-0.1, or 0 for "
                             "none")
        self.timeout_s, self.tool_parser, self.model = float(timeout_s), tool_parser, model
        self.format_penalty = float(format_penalty)
        self.expert = load_entry(expert, "env.config.expert") if expert is not None else None

    def task(self, seed: int) -> Any:
        """The task of the episodes with ``seed`` (module docstring)."""
        if self.tasks is not None:
            return self.tasks[seed % len(self.tasks)]
        return self.tasks_entry(seed) if self.tasks_entry is not None else None

    def reset(self, seed: int) -> str:
        raise RuntimeError("env agent_program is a program run by the trainer's program driver, not a stepped env")

    def step(self, action: str) -> StepResult:
        raise RuntimeError("env agent_program is a program run by the trainer's program driver, not a stepped env")

    def legal_actions(self) -> str:
        return ""
