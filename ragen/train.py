"""Hydra entry point: ``python -m ragen.train [--config-name NAME] [key=value ...]``.

Configs live in the repository's ``config/`` folder (or ``$RAGEN_CONFIG_DIR``); ``--cfg job`` prints the
composed config without running. A config error exits with status 2 and one line per problem. Plugins (the
``ragen.envs`` / ``ragen.estimators`` entry points and the modules of ``imports=[...]``) are imported before Hydra
composes (``ragen.plugins``).
"""

from __future__ import annotations

import hydra

from ragen.trainer.compose import config_dir, prepare_cli


@hydra.main(config_path=str(config_dir()), config_name="base", version_base="1.3")
def main(cfg) -> None:
    from ragen.trainer.main import cli_main
    from ragen.trainer.validate import validate

    cli_main(cfg, validate)


if __name__ == "__main__":
    prepare_cli("base")  # plugins (entry points, imports) before Hydra composes
    main()
