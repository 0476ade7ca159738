"""Hydra entry point: ``python -m ragen.archer [--config-name archer_twenty_questions] [key=value ...]``.

Same config tree as ``python -m ragen.train`` (``config/``); the ``archer`` section selects the algorithm
(``archer.algorithm=archer|chai|filtered_bc``). A config error exits with status 2 and one line per problem.
"""

from __future__ import annotations

import sys

import hydra

from ragen.trainer.compose import config_dir, to_train_config
from ragen.trainer.config import ConfigError


@hydra.main(config_path=str(config_dir()), config_name="archer_twenty_questions", version_base="1.3")
def main(cfg) -> None:
    from ragen.archer.main import run, validate_archer
    from ragen.trainer.main import run_cli

    try:
        train_cfg = to_train_config(cfg)
        validate_archer(train_cfg)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    run_cli(train_cfg, label=f"{train_cfg.archer.algorithm} done", runner=run)


if __name__ == "__main__":
    main()
