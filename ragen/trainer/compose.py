"""Find and compose the Hydra configs under ``config/`` and turn them into a frozen ``TrainConfig``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ragen.trainer.config import ConfigError, TrainConfig, build_config


def config_dir() -> Path:
    """``$RAGEN_CONFIG_DIR`` or the repository's ``config/`` folder (next to the ``ragen`` package)."""
    env = os.environ.get("RAGEN_CONFIG_DIR")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[2] / "config"


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
