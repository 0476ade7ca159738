"""Find and compose the Hydra configs under ``config/`` and turn them into a frozen ``TrainConfig``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ragen.trainer.config import ConfigError, TrainConfig, build_config

CONFIG_PACKAGE = "ragen_config"  # the installed copy of config/ (setup.py maps the package to that folder)


def config_dir() -> Path:
    """The Hydra config folder: ``$RAGEN_CONFIG_DIR``, else the checkout's ``config/`` (next to the ``ragen``
    package), else the copy installed with the package (``ragen_config``, a wheel's package data)."""
    env = os.environ.get("RAGEN_CONFIG_DIR")
    if env:
        return Path(env).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[2] / "config"
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


def compose(config_name: str = "base", overrides: list[str] | None = None) -> Any:
    """Compose ``config/<config_name>.yaml`` with Hydra overrides (outside ``@hydra.main``, e.g. in tests)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides or []))


def load_train_config(config_name: str = "base", overrides: list[str] | None = None) -> TrainConfig:
    """``compose`` + ``to_train_config``."""
    return to_train_config(compose(config_name, overrides))
