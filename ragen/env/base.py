"""The environment protocol and registry shared by every text environment.

An environment is a small object that plays one episode at a time:

* ``reset(seed) -> str`` starts an episode (deterministic per seed) and returns the first observation;
* ``step(action) -> StepResult`` applies ONE action (the agent proxy splits ``a || b`` into several
  actions and calls ``step`` once per action, up to its per-turn limit);
* ``instructions`` (str) describes the task and the action format; ``legal_actions()`` lists the
  actions that are legal *now*, as text, so prompts can show them.

``StepResult.info`` always carries ``action_is_valid``, ``action_is_effective`` and ``success``.
Environments with turn-level credit (e.g. ``search_qa``) add ``step_reward`` and ``outcome_reward`` to
``info`` and say so with the class attribute ``STEP_OUTCOME_SPLIT = True`` (read by config validation before
any worker starts); the agent proxy collects them into the batch's ``step_rewards`` / ``outcome_rewards``. They
also set ``info["tool_result"]`` (bool): this step returned a tool's output to the agent (absent = False). MS-GRPO
and MS-PO place the step credit by this flag (the batch's ``tool_results``), never by the step reward's value.
Invalid or garbage actions never raise: they return ``action_is_valid=False`` and leave the state as is.

Optional: ``expert_action() -> str``, the action a good (ideally optimal) player takes in the *current* state,
written exactly as ``step`` accepts it (one action, no tags), so ``while not done: env.step(env.expert_action())``
plays the env. It only reads the state: it never changes it nor draws from the env's randomness (calling it twice
gives the same answer, and an env stepped with expert actions behaves exactly like one stepped with the same
strings typed by hand), and it works from any reachable state, also one reached by other actions (noisy experts
recover). It raises ``RuntimeError`` before ``reset`` and once the episode is over. ``has_expert(name)`` tells which
envs have one (used by the supervised warm start, ``ragen.agent.expert``); envs without one say why in their
module docstring.

Optional: ``action_list() -> list[str]``, every action legal now, one string each as ``step`` accepts it (empty when
none can be listed). Envs with a small fixed action set have it (moves, arms, doors); envs whose actions are free
text (questions, expressions, answers) do not, as ``legal_actions()`` can only describe them. A warm start's random
legal actions (``sft.noise`` > 0) are drawn from it, so config validation refuses ``sft.noise`` > 0 for an env
without it (``has_action_list(name)``).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

REQUIRED_INFO_KEYS = ("action_is_valid", "action_is_effective", "success")


@dataclass
class StepResult:
    """What one ``Env.step`` returns."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in REQUIRED_INFO_KEYS:
            self.info.setdefault(key, False)


def step_result_problem(res: Any) -> str | None:
    """Why ``res`` (what an ``Env.step`` returned) breaks the protocol, or None: it must be a :class:`StepResult`
    with a ``str`` observation, a finite real reward, a boolean ``done`` and a dict ``info``."""
    if not isinstance(res, StepResult):
        return f"step returned {type(res).__name__}, not StepResult"
    if not isinstance(res.observation, str):
        return f"observation is {type(res.observation).__name__}, not str"
    try:
        finite = isinstance(res.reward, int | float) or hasattr(res.reward, "__float__")
        finite = finite and not isinstance(res.reward, bool) and math.isfinite(float(res.reward))
    except (TypeError, ValueError, OverflowError):
        finite = False
    if not finite:
        return f"reward {res.reward!r} is not a finite number"
    if not isinstance(res.done, bool) and res.done not in (0, 1):  # numpy bools compare equal to 0 / 1
        return f"done {res.done!r} is not a bool"
    if not isinstance(res.info, dict):
        return f"info is {type(res.info).__name__}, not dict"
    return None


def smoke_test(env: Any, seed: int) -> list[str]:
    """Play one step of ``env`` as the agent proxy would and list how it breaks the protocol (empty: it does not).

    ``reset(seed)`` returns a str, ``instructions`` is a str, ``legal_actions()`` exists and returns a str, and one
    ``step`` (with the expert's action where the env has one, else the first legal action it lists, else a garbage
    string, which an env must answer with ``action_is_valid=False``) returns a :class:`StepResult` with a str
    observation, a finite reward, a bool ``done`` and the required info keys (:func:`step_result_problem`).
    Each problem names the method; an exception is reported with its type and message. ``--check`` runs it on every
    env of a run, so a broken env fails in seconds instead of failing every episode of a run."""
    def call(what: str, fn: Callable[[], Any]) -> tuple[Any, str | None]:
        try:
            return fn(), None
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            return None, f"{what} raised {type(exc).__name__}: {str(exc)[:200]}"

    observation, problem = call(f"reset({seed})", lambda: env.reset(seed))
    if problem is not None:
        return [problem]
    out = [] if isinstance(observation, str) else [f"reset({seed}) returned {type(observation).__name__}, not str"]
    if not isinstance(getattr(env, "instructions", None), str):
        out.append(f"instructions is {type(getattr(env, 'instructions', None)).__name__}, not str")
    if not callable(getattr(env, "legal_actions", None)):
        out.append("it has no legal_actions() method (the prompts list the legal actions every turn)")
        legal = ""
    else:
        legal, problem = call("legal_actions()", env.legal_actions)
        if problem is not None or not isinstance(legal, str):
            out.append(problem or f"legal_actions() returned {type(legal).__name__}, not str")
            legal = ""
    action = _smoke_action(env, legal)
    result, problem = call(f"step({action!r})", lambda: env.step(action))
    problem = problem or step_result_problem(result)
    if problem is None:
        missing = [k for k in REQUIRED_INFO_KEYS if k not in result.info]
        problem = f"info lacks {missing}" if missing else None
    return out + ([f"step({action!r}): {problem}" if not problem.startswith("step(") else problem] if problem else [])


def _smoke_action(env: Any, legal: str) -> str:
    """The action :func:`smoke_test` steps with: the expert's, else the first legal action listed, else garbage."""
    expert = getattr(env, "expert_action", None)
    if callable(expert):
        try:
            action = expert()
            if isinstance(action, str) and action:
                return action
        except Exception:  # noqa: BLE001 - the step below still tests the env
            pass
    listed = [a.strip() for a in legal.replace("[", ",").replace("]", ",").replace("|", ",").split(",") if a.strip()]
    return listed[0] if listed else "?"


@runtime_checkable
class Env(Protocol):
    """A text environment (see the module docstring)."""

    instructions: str

    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def legal_actions(self) -> str: ...


_REGISTRY: dict[str, Callable[..., Env]] = {}

# Built-in envs are imported on first use, so ``import ragen.env`` stays light (no gymnasium, bm25s...).
# Each module registers its env(s) with ``@register(name)`` when imported.
_BUILTIN_MODULES: dict[str, str] = {
    "bandit": "ragen.env.bandit",
    "delayed_choice": "ragen.env.delayed_choice",
    "frozen_lake": "ragen.env.frozen_lake",
    "sokoban": "ragen.env.sokoban",
    "countdown": "ragen.env.countdown",
    "webshop": "ragen.env.webshop",
    "search_qa": "ragen.env.search_qa",
    "twenty_questions": "ragen.env.twenty_questions",
    "guess_my_city": "ragen.env.guess_my_city",
    "static_qa": "ragen.env.static_qa",
    "text_adventure": "ragen.env.text_adventure",
    "agent_program": "ragen.env.agent_program",
}


def register(name: str) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    """Class decorator: make an env constructible as ``ragen.env.make(name, **config)``."""

    def deco(factory: Callable[..., Env]) -> Callable[..., Env]:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"env name {name!r} is already registered by {_REGISTRY[name]!r}")
        _REGISTRY[name] = factory
        return factory

    return deco


def names() -> list[str]:
    """Sorted names of all registered environments (built-in ones included before their first use)."""
    return sorted(set(_REGISTRY) | set(_BUILTIN_MODULES))


def config_keys(name: str) -> list[str]:
    """The keyword arguments env ``name`` accepts (its config keys)."""
    factory = _lookup(name)
    params = inspect.signature(factory).parameters
    return [p for p, v in params.items() if v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)]


def _lookup(name: str) -> Callable[..., Env]:
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _REGISTRY:
        raise ValueError(f"unknown env {name!r}; registered envs: {', '.join(names())}")
    return _REGISTRY[name]


def reports_step_split(name: str) -> bool:
    """True when env ``name`` reports the step / outcome reward split (``STEP_OUTCOME_SPLIT``) that MS-GRPO and
    MS-PO need."""
    return bool(getattr(_lookup(name), "STEP_OUTCOME_SPLIT", False))


def has_expert(name: str) -> bool:
    """True when env ``name``'s registered factory has an ``expert_action`` method (see the module docstring)."""
    return callable(getattr(_lookup(name), "expert_action", None))


def has_action_list(name: str) -> bool:
    """True when env ``name``'s registered factory lists its legal actions (``action_list``, module docstring)."""
    return callable(getattr(_lookup(name), "action_list", None))


def is_program(name: str) -> bool:
    """True when ``name`` is the config of a user's agent program (class attribute ``PROGRAM``,
    ``ragen.env.agent_program``): the trainer runs it through its program driver instead of stepping it."""
    return bool(getattr(_lookup(name), "PROGRAM", False))


def make(name: str, **config: Any) -> Env:
    """Build env ``name`` with ``config`` as keyword arguments.

    Unknown names and unknown config keys raise a ``ValueError`` that lists the valid ones, so a bad
    config fails before any worker starts.
    """
    factory = _lookup(name)
    valid = config_keys(name)
    bad = sorted(set(config) - set(valid))
    if bad:
        raise ValueError(f"unknown config key(s) {bad} for env {name!r}; valid keys: {', '.join(valid)}")
    return factory(**config)


def plugin_names() -> list[str]:
    """Registered envs that are not built into ragen (plugins: ``ragen.plugins.load_plugins``), sorted."""
    return sorted(set(_REGISTRY) - set(_BUILTIN_MODULES))


def default_config(name: str) -> dict[str, Any]:
    """Env ``name``'s own defaults as an env config section (``{name, max_turn, max_actions_per_turn, config}``).

    Declared by the env's factory, so a plugin env needs no YAML file: class attributes ``DEFAULT_MAX_TURN`` and
    ``DEFAULT_MAX_ACTIONS_PER_TURN`` (1 when absent) and the constructor's keyword arguments with their defaults as
    ``config`` (``"???"``, OmegaConf's "required", for an argument without a default). Tuples become lists; a
    default that is not plain data (None, bool, number, string, list, dict) raises a ``ValueError`` naming it."""
    factory = _lookup(name)
    config = {}
    for key, param in inspect.signature(factory).parameters.items():
        if param.kind not in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
            continue
        value = "???" if param.default is param.empty else _plain(param.default)
        if value is _NOT_PLAIN:
            raise ValueError(f"env {name!r}: the default of {key}={param.default!r} cannot go in a config; give "
                             "it a plain default (None, a number, a string, a list) or ship config/env/<name>.yaml")
        config[key] = value
    turns = {k: int(getattr(factory, f"DEFAULT_{k.upper()}", 1)) for k in ("max_turn", "max_actions_per_turn")}
    return {"name": name, **turns, "config": config}


_NOT_PLAIN = object()


def _plain(value: Any) -> Any:
    """``value`` as YAML-able data (tuples as lists), or ``_NOT_PLAIN``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        items = [_plain(v) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        items = {k: _plain(v) for k, v in value.items()}
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in items.values()) else items
    return _NOT_PLAIN


def missing_extras(name: str) -> list[str]:
    """What env ``name`` needs but is not installed, one message each naming the extra to install. An env declares
    its optional packages in the class attribute ``EXTRAS``: ``{import name: extra of ragen}``."""
    import importlib.util

    extras = getattr(_lookup(name), "EXTRAS", {}) or {}
    return [f"env {name} needs the {module} package: install extra {extra}, pip install 'ragen[{extra}]'"
            for module, extra in sorted(extras.items()) if importlib.util.find_spec(module) is None]
