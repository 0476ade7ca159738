"""Hydra entry point: ``python -m ragen.archer [--config-name archer_twenty_questions] [key=value ...]``.

Same config tree as ``python -m ragen.train`` (``config/``); ``algorithm.name=archer|chai|filtered_bc`` selects
the algorithm, the ``archer`` section its loop. A config error exits with status 2 and one line per problem.
"""

from __future__ import annotations

import hydra

from ragen.trainer.compose import config_dir, prepare_cli


@hydra.main(config_path=str(config_dir()), config_name="archer_twenty_questions", version_base="1.3")
def main(cfg) -> None:
    from ragen.archer.main import run, validate_archer
    from ragen.trainer.main import cli_main

    cli_main(cfg, validate_archer, label=f"{cfg.algorithm.name} done", runner=run)


if __name__ == "__main__":
    prepare_cli("archer_twenty_questions")  # plugins (entry points, imports) before Hydra composes
    main()
