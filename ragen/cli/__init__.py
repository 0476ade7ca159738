"""The ``ragen`` console script: ``ragen train | eval | report | archer | sft`` (setup.py ``console_scripts``).

Each subcommand is the ``python -m`` entry point of the same name with the same arguments (``ragen train`` =
``python -m ragen.train``...) and its own ``--help``. The Hydra commands (train, archer, sft) live in
``ragen.cli.hydra_app``: help, ``--check`` (a dry run) and "did you mean" for misspelled overrides.
"""

from __future__ import annotations

import importlib
import sys

from ragen.allocator import tune_process

# subcommand -> (module with main(argv, prog), one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ragen.cli.train", "train with a PPO-family estimator (= python -m ragen.train; the launch scripts)"),
    "eval": ("ragen.cli.eval", "evaluate one model or compare two on fixed env seeds (= python -m ragen.eval)"),
    "report": ("ragen.cli.report", "rebuild a run folder's HTML report (= python -m ragen.report)"),
    "archer": ("ragen.cli.archer", "train with ArCHer, online CHAI or filtered BC (= python -m ragen.archer)"),
    "sft": ("ragen.cli.sft", "the supervised warm start alone (= python -m ragen.sft)"),
}


def usage() -> str:
    lines = ["usage: ragen {" + ",".join(COMMANDS) + "} [arguments ...]", "", "commands:"]
    lines += [f"  {name:<8} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "`ragen <command> --help` shows a command's options, examples and configs; e.g.",
              "  ragen train --config-name ppo_bandit model=tiny trainer.total_steps=2 --check"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``) to a subcommand; returns its exit status. The console script's
    process gets ragen's process settings first (``ragen.allocator.tune_process``, before any subcommand loads
    torch)."""
    tune_process()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        import difflib

        near = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"; did you mean `ragen {near[0]}`?" if near else ""
        print(f"ragen: unknown command {name!r}{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest, prog=f"ragen {name}") or 0)
