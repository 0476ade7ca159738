"""Your own envs and advantage estimators, found without editing ragen: entry points and the ``imports`` key.

Two ways in, both loaded by :func:`load_plugins` before Hydra composes the config (the trainer's entry points call
it through ``ragen.trainer.config.compose.prepare_composition``) and again in every Ray worker process (Ray runs
:func:`load_plugins_from_environ` as the workers' setup hook; ``ragen.trainer.builders.start_ray``):

* an installed package declares entry points in the groups ``ragen.envs`` / ``ragen.estimators``. An entry point's
  value is either a module that registers its envs (``@ragen.env.register(name)``) or estimators
  (``ragen.algorithms.register_estimator``) when imported, or the env factory / estimator function itself, which is
  then registered under the entry point's name (an estimator function's ``needs`` attribute, if any, gives the
  ``AdvantageInputs`` fields it reads);
* the config's top-level ``imports: [my_pkg.envs, ...]`` (or ``imports=[...]`` on the command line) names modules to
  import, e.g. a module on ``PYTHONPATH`` that is not an installed package.

A registered env needs no YAML file: for a plugin env without ``config/env/<name>.yaml`` a Hydra config node (group
``env``, option ``<name>``) is stored from the env's own defaults (``ragen.env.default_config``), so ``env=<name>``
selects it like a shipped env. Loading is idempotent: a module is imported and an entry point loaded once per
process.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ragen.allocator import tune_process

ENV_GROUP = "ragen.envs"
ESTIMATOR_GROUP = "ragen.estimators"
ENVIRON_VAR = "RAGEN_IMPORTS"  # the imports handed to the Ray workers (comma-separated module names)

_loaded: set[str] = set()  # modules imported and entry points loaded in this process ("group:name=value")


class PluginError(ImportError):
    """A plugin module or entry point could not be loaded; the message names it and the fix."""


def load_plugins(imports: Iterable[str] = (), env_config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """Import every entry point of :data:`ENV_GROUP` / :data:`ESTIMATOR_GROUP` and every module in ``imports``;
    then store a Hydra config node for each plugin env that has no ``<name>.yaml`` in ``env_config_dirs``.

    Returns what this call loaded for the first time (entry points as ``group:name``, then module names). Raises
    :class:`PluginError` naming the module or entry point, the original error and the fix."""
    new = []
    for group in (ENV_GROUP, ESTIMATOR_GROUP):
        for ep in importlib.metadata.entry_points(group=group):
            key = f"{group}:{ep.name}={ep.value}"
            if key not in _loaded:
                _load_entry_point(group, ep)
                _loaded.add(key)
                new.append(f"{group}:{ep.name}")
    for module in imports:
        if module not in _loaded:
            import_module(module)
            _loaded.add(module)
            new.append(module)
    store_env_nodes(env_config_dirs)
    return new


def load_plugins_from_environ() -> None:
    """The Ray workers' setup hook: ragen's process settings (``ragen.allocator.tune_process``: the worker runs it
    before it loads torch), then :func:`load_plugins` with the driver's ``imports`` (``$RAGEN_IMPORTS``)."""
    tune_process()
    load_plugins([m for m in os.environ.get(ENVIRON_VAR, "").split(",") if m])


def import_module(module: str) -> Any:
    """``importlib.import_module(module)``; a failure raises :class:`PluginError` saying where it was named."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any error inside the plugin's import is reported with its module
        raise PluginError(f"imports: cannot import {module!r} ({type(exc).__name__}: {exc}); install the package "
                          "that provides it or put its folder on PYTHONPATH, or remove it from imports") from exc


def _load_entry_point(group: str, ep: importlib.metadata.EntryPoint) -> None:
    dist = getattr(ep, "dist", None)
    where = f"entry point {ep.name} = {ep.value} (group {group}" + (f", package {dist.name}" if dist else "") + ")"
    try:
        obj = ep.load()
        if callable(obj):  # else a module: importing it registered its envs / estimators
            _register(group, ep.name, obj)
    except Exception as exc:  # noqa: BLE001 - report which installed plugin broke, whatever broke it
        raise PluginError(f"{where} failed to load ({type(exc).__name__}: {exc}); fix or reinstall that package, or "
                          "uninstall it") from exc


def _register(group: str, name: str, obj: Any) -> None:
    """Register an entry point's env factory / estimator function under the entry point's name (a name another
    object holds already raises ``ValueError``)."""
    if group == ENV_GROUP:
        import ragen.env

        ragen.env.register(name)(obj)
        return
    from ragen.algorithms import ADVANTAGE_ESTIMATORS, register_estimator

    spec = ADVANTAGE_ESTIMATORS.get(name)
    if spec is None or spec.fn is not obj:
        register_estimator(name, obj, needs=tuple(getattr(obj, "needs", ())))


def store_env_nodes(env_config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """Store a Hydra config node (group ``env``, option ``<name>``, package ``env``) built from
    ``ragen.env.default_config`` for every plugin env without a ``<name>.yaml`` in ``env_config_dirs``; returns
    their names."""
    from hydra.core.config_store import ConfigStore

    import ragen.env

    stored = []
    for name in ragen.env.plugin_names():
        if any((Path(d) / f"{name}.yaml").is_file() for d in env_config_dirs):
            continue  # its own file wins (a node of the same name would also become the file's schema)
        try:
            node = ragen.env.default_config(name)
        except ValueError as exc:
            raise PluginError(f"{exc} (a plugin env without a config file)") from exc
        ConfigStore.instance().store(group="env", name=name, node=node, package="env")
        stored.append(name)
    return stored
