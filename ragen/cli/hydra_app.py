"""The Hydra commands (``ragen train | archer | sft``, ``python -m ragen.train | ragen.archer | ragen.sft``).

Each is a :class:`ragen.cli.command.HydraCommand` run by :func:`main`, a thin wrapper around ``@hydra.main``
that keeps Hydra's whole command line (``key=value``, ``group=choice``, ``+key=value``, ``~key``,
``--config-name``, ``--cfg job [--resolve]``, ``-m``, ``--hydra-help``...) and first:

1. answers ``-h`` / ``--help`` with the command's own help (``ragen.cli.help``), not Hydra's config dump;
2. turns ``--check`` into ``trainer.dry_run=true`` (``ragen.trainer.dry_run``: check everything, print the plan);
3. checks the overrides and the config name (``ragen.cli.overrides``): a misspelled key or choice exits with
   status 2 and "did you mean <closest>", one line per problem, before Hydra's own message;
4. hands ``algorithm.estimator_args.<name>=value`` to Hydra as ``++...`` (the entry is added; the estimator's
   signature checks the name: ``ragen.trainer.config.compose.open_mapping_overrides``).

Hydra then composes the config and calls the command's ``task`` (``ragen.launch.cli_main``: validation and
the pre-start checks, then the run, or the plan for a dry run).
"""

from __future__ import annotations

import sys
from typing import Any

from ragen.cli.command import HydraCommand

# Hydra options after which the override check is left to Hydra: other config folders, reruns, completion, help.
UNCHECKED = ("config_path", "config_dir", "experimental_rerun", "shell_completion", "hydra_help", "info")


def main(cmd: HydraCommand, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run ``cmd`` on ``argv`` (default ``sys.argv[1:]``); returns the exit status (Hydra and the task may also exit:
    2 for a config problem, 1 for a Hydra error)."""
    import hydra

    from ragen.trainer.config.compose import config_dir, open_mapping_overrides
    from ragen.trainer.config.schema import ConfigError

    args = open_mapping_overrides(sys.argv[1:] if argv is None else argv)  # algorithm.estimator_args.<name>=v adds
    prog = prog or f"ragen {cmd.name}"
    _before_compose(args, cmd.config_name)
    if "-h" in args or "--help" in args:
        from ragen.cli.help import help_text

        print(help_text(cmd, prog))
        return 0
    if "--check" in args:
        args = [a for a in args if a != "--check"] + ["trainer.dry_run=true"]
    if not (config_dir() / "base.yaml").is_file():
        print(f"{prog}: no config folder found ({config_dir()} has no base.yaml); set RAGEN_CONFIG_DIR to a folder "
              "like the repository's config/, or reinstall ragen (its wheel ships config/ as ragen_config)",
              file=sys.stderr)
        return 2
    parsed = _parse(args)
    if parsed is not None and not any(getattr(parsed, k, None) for k in UNCHECKED):
        from ragen.cli.overrides import override_problems

        problems = override_problems(parsed.config_name or cmd.config_name, list(parsed.overrides))
        if problems:
            print(ConfigError(problems), file=sys.stderr)
            return 2
    task = hydra.main(config_path=str(config_dir()), config_name=cmd.config_name, version_base="1.3")(cmd.task)
    saved = sys.argv
    sys.argv = [prog, *args]
    try:
        task()
    finally:
        sys.argv = saved
    return 0


def _before_compose(args: list[str], config_name: str) -> None:
    """Runs before anything reads the config folder (help, override checks, Hydra's composition), with the
    command line: loads the env / estimator plugins (the ``ragen.envs`` / ``ragen.estimators`` entry points and the
    modules of ``imports``, ``ragen.trainer.config.compose.prepare_from_argv``), whose config nodes Hydra must find. A
    plugin that fails to import exits with status 2 and its message, as a config error does."""
    from ragen.plugins import PluginError
    from ragen.trainer.config.compose import prepare_from_argv

    try:  # the ragen flags (help, --check) are not Hydra's: its parser would print a usage error for them
        prepare_from_argv(config_name, [a for a in args if a not in ("-h", "--help", "--check")])
    except PluginError as exc:
        print(f"[ragen] {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _parse(args: list[str]) -> Any:
    """Hydra's own parse of the command line (flags and overrides), or None when it would reject it (Hydra then
    prints its usage error)."""
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # Hydra prints the usage error itself
            parsed, unknown = get_args_parser().parse_known_args(args)
    except SystemExit:
        return None
    return None if unknown else parsed
