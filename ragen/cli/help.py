"""``--help`` of the Hydra commands: usage, examples, the configs and config groups, overrides, ``--check`` and
outputs. The configs and group choices are listed from the config folder in use (``config_dir()``, plus the
ConfigStore), so the help always names what the command accepts."""

from __future__ import annotations

import textwrap

from ragen.cli.command import HydraCommand

WIDTH = 118

OVERRIDES = """overrides (Hydra's syntax, any number, after the options):
  key=value        set a key, e.g. actor.lr=1e-6 trainer.total_steps=50 agent.think=false
  group=choice     use config/<group>/<choice>.yaml, e.g. env=sokoban algorithm=grpo model=tiny trainer=gpu
  +key=value       add a key the config lacks (e.g. +env.config.seed=3); ++key=value sets or adds it
  ~key             delete a key (e.g. ~env.config.size)
  --config-name N  the primary config config/N.yaml (an experiment: its own keys beat the groups it selects)
  --cfg job        print the composed config and exit; ${...} interpolations are printed as written, add
                   --resolve to print their values
  --hydra-help     Hydra's own options (multirun -m, --info, ...)
A key or choice that does not exist stops the command with status 2 and "did you mean <closest>"; a value the
config rejects stops it with one line per problem, naming the key and the fix."""

CHECK = """--check  (= trainer.dry_run=true)
  Compose and validate everything, load the model's config and tokenizer (no weights), build each env once, check
  the output folder, then print the plan: workers per role and their world sizes, devices and GPUs, Ray or
  in-process, the batch arithmetic (groups x group size = episodes, rows, mini / micro batches, optimizer steps
  per step and in total), the engine and its dtype, the env, estimator, steps and output folder. Exits 0 without
  starting a worker or Ray or writing a file; exits 2 with one line per problem."""

RUN_OUTPUTS = """outputs: trainer.output_dir (base: runs/<env>_<estimator>) gets config.json, metrics.jsonl,
  learning_curve.png, train.log (everything the quiet console does not show; trainer.verbose=true shows it live),
  report/index.html, val_rollouts/, train_samples/, checkpoints/global_step_N (actor/ loads with from_pretrained)
  and wandb/ (offline unless a key is set). Running again into the same folder continues the run from its latest
  complete checkpoint (trainer.resume=auto). A run saved there with another config is refused before anything is
  written, naming the differing keys: continue it anyway with trainer.resume=force, or use a new
  trainer.output_dir."""


def help_text(cmd: HydraCommand, prog: str) -> str:
    """The help of ``cmd`` as invoked by ``prog`` (``ragen train``, ``python -m ragen.train``...)."""
    from ragen.cli.overrides import config_options
    from ragen.trainer.config.compose import config_dir

    opts = config_options()
    examples = []
    for args, note in cmd.examples:
        examples += ([f"  # {note}"] if note else []) + [f"  {prog} {args}".rstrip()]
    groups = [_wrapped(f"  {g:<10} ", ", ".join(c)) for g, c in opts.groups.items()]
    other = "ragen train" if cmd.name != "train" else "ragen archer"
    lines = [
        f"usage: {prog} [--config-name NAME] [--check] [key=value | group=choice | +key=value | ~key ...]",
        f"       {prog} [--config-name NAME] [overrides ...] --cfg job [--resolve]",
        "",
        textwrap.fill(cmd.summary, WIDTH),
        "",
        "examples:",
        *examples,
        "",
        _wrapped(f"configs (--config-name, default {cmd.config_name}): ", ", ".join(opts.configs)),
        "config groups (group=choice):",
        *groups,
        f"  (read from {config_dir()}; every key and its default: {prog} --cfg job)",
        "",
        OVERRIDES,
        "",
        CHECK,
        "",
        cmd.outputs,
        "",
        f"Same as `ragen {cmd.name}` and `python -m {cmd.module}`; see also `{other} --help`, `ragen eval --help`.",
    ]
    return "\n".join(lines)


def _wrapped(head: str, text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=head, subsequent_indent=" " * min(len(head), 13))
