"""Hydra entry point: ``python -m ragen.train [--config-name NAME] [key=value ...]``.

Configs live in the repository's ``config/`` folder (or ``$RAGEN_CONFIG_DIR``); ``--cfg job`` prints the
composed config without running. A config error exits with status 2 and one line per problem.
"""

from __future__ import annotations

import sys

import hydra

from ragen.trainer.compose import config_dir, to_train_config
from ragen.trainer.config import ConfigError


@hydra.main(config_path=str(config_dir()), config_name="base", version_base="1.3")
def main(cfg) -> None:
    from ragen.trainer.main import run_cli

    try:
        train_cfg = to_train_config(cfg)
        from ragen.trainer.validate import validate

        validate(train_cfg)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    run_cli(train_cfg)


if __name__ == "__main__":
    main()
