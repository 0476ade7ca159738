"""Find and compose the Hydra configs under ``config/`` and turn them into a frozen ``TrainConfig``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen.trainer.config.schema import ConfigError, TrainConfig, build_config

CONFIG_PACKAGE = "ragen_config"  # the installed copy of config/ (setup.py maps the package to that folder)
# Mappings whose keys are the user's own, not the schema's (an estimator's hyperparameters): Hydra's struct mode takes
# only keys the composed config has, so a plain ``<mapping>.<name>=value`` is handed to Hydra as ``++`` (set or add).
OPEN_MAPPINGS = ("algorithm.estimator_args",)


def config_dir() -> Path:
    """The Hydra config folder: ``$RAGEN_CONFIG_DIR``, else the checkout's ``config/`` (next to the ``ragen``
    package), else the copy installed with the package (``ragen_config``, a wheel's package data)."""
    env = os.environ.get("RAGEN_CONFIG_DIR")
    if env:
        return Path(env).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[3] / "config"
    if (checkout / "base.yaml").is_file():
        return checkout
    import importlib.util

    spec = importlib.util.find_spec(CONFIG_PACKAGE)  # a folder of YAML files: located, never imported as code
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / "base.yaml").is_file():
                return Path(location)
    return checkout  # not found: Hydra's own error names this folder


def to_train_config(cfg: Any) -> TrainConfig:
    """Resolve an OmegaConf tree (interpolations included) and build the frozen :class:`TrainConfig`."""
    from omegaconf import OmegaConf

    if not isinstance(cfg, dict):
        missing = sorted(k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra."))
        if missing:
            raise ConfigError([f"{k} is required (??? in the config); set it on the command line, e.g. {k}=<value>"
                               for k in missing])
    raw = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else cfg
    raw = {k: v for k, v in raw.items() if k != "hydra"}
    return build_config(raw)


def prepare_composition(config_name: str = "base", overrides: Sequence[str] = (),
                        config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """Load the plugins a composition needs, before Hydra composes: every ``ragen.envs`` / ``ragen.estimators``
    entry point and the modules of ``imports`` (``ragen.plugins.load_plugins``), so that ``env=<plugin env>`` and
    ``algorithm.estimator=<plugin estimator>`` resolve. ``imports`` is the command line's (``imports=[a,b]``) if
    given, else the primary config's (``<config_name>.yaml`` in ``config_dirs`` or :func:`config_dir`, or the
    configs it inherits). Every Hydra entry point calls this first (:func:`prepare_from_argv`, from
    ``ragen.cli.hydra_app``); :func:`compose` does. Returns the imports; raises ``ragen.plugins.PluginError``
    naming a module that failed."""
    from ragen.plugins import load_plugins

    dirs = [Path(d) for d in config_dirs] + [config_dir()]
    imports = _override_imports(overrides)
    if imports is None:
        imports = _file_imports(config_name, dirs, set()) or []
    load_plugins(imports, env_config_dirs=[d / "env" for d in dirs])
    return imports


def prepare_from_argv(default_config_name: str, argv: Sequence[str] | None = None) -> list[str]:
    """:func:`prepare_composition` for a ``@hydra.main`` entry point's command line (``--config-name``,
    ``--config-dir``, overrides; default ``sys.argv[1:]``). A command line Hydra's parser rejects is left to Hydra."""
    import sys

    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit:
        return []
    return prepare_composition(args.config_name or default_config_name, args.overrides,
                               [args.config_dir] if args.config_dir else [])


def _override_imports(overrides: Sequence[str]) -> list[str] | None:
    """The ``imports`` a command line sets (``imports=[a,b]``, ``+imports=a``, ``~imports``), or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 - Hydra reports a malformed override itself when it composes
        return None
    found = None
    for o in parsed:
        if o.key_or_group == "imports":
            value = None if o.is_delete() else o.value()
            found = [] if value is None else [value] if isinstance(value, str) else [str(m) for m in value]
    return found


def _file_imports(name: str, dirs: list[Path], seen: set[str]) -> list[str] | None:
    """``imports`` of config ``name`` (its own key, else the last inherited config's that sets one), or None."""
    import yaml

    path = next((d / f"{name}.yaml" for d in dirs if (d / f"{name}.yaml").is_file()), None)
    if path is None or name in seen:
        return None
    seen.add(name)
    raw = yaml.safe_load(path.read_text()) or {}
    if raw.get("imports") is not None:
        return list(raw["imports"])
    inherited = None
    for entry in raw.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            inherited = _file_imports(entry, dirs, seen) or inherited
    return inherited


def open_mapping_overrides(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with each plain override of a key in (or of) an :data:`OPEN_MAPPINGS` mapping as ``++<line>``,
    so ``algorithm.estimator_args.beta=0.3`` adds the entry as ``+algorithm.estimator_args.beta=0.3`` does (the
    estimator's signature checks the name, ``ragen.algorithms.registry.bind_estimator_args``). Other lines, flags
    and ``+`` / ``++`` / ``~`` overrides are kept as they are."""
    out = []
    for line in overrides:
        key = line.split("=", 1)[0]
        opened = "=" in line and any(key == m or key.startswith(f"{m}.") for m in OPEN_MAPPINGS)
        out.append(f"++{line}" if opened else line)
    return out


def compose(config_name: str = "base", overrides: list[str] | None = None) -> Any:
    """Compose ``config/<config_name>.yaml`` with Hydra overrides (outside ``@hydra.main``, e.g. in tests), after
    :func:`prepare_composition`; the overrides of open mappings as :func:`open_mapping_overrides` gives them."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = open_mapping_overrides(overrides or [])
    prepare_composition(config_name, overrides)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides)


def load_train_config(config_name: str = "base", overrides: list[str] | None = None) -> TrainConfig:
    """``compose`` + ``to_train_config``."""
    return to_train_config(compose(config_name, overrides))
