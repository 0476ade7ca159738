"""Command line of ``python -m ragen.eval``: parse, check everything, evaluate each model on each env, report.

All checks (config composition, env names, model arguments) run before the first model loads, so a typo costs
seconds, not a model load. Models are loaded one at a time (each plays every env, then is released).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ragen.evaluation.models import ModelArgError, ModelSpec, resolve_model_args
from ragen.evaluation.report import build_report, env_report, format_table, write_json
from ragen.evaluation.runner import build_model, describe_env, env_config, evaluate_env, release_memory, saved_config
from ragen.trainer.config.schema import ConfigError, TrainConfig

EXAMPLES = """examples:
  python -m ragen.eval runs/bandit_gae --env bandit --n 200
  python -m ragen.eval smollm2-135m-instruct runs/bandit_gae --env bandit --env delayed_choice --json eval.json
  python -m ragen.eval runs/x/checkpoints/global_step_20 --env frozen_lake agent.think=false \\
      "agent.response_prefix='<answer>'"
  python -m ragen.eval openai:my-model --base-url http://localhost:8000/v1 --env sokoban \\
      model.tokenizer_path=/models/my-model

A run folder (or a checkpoint of a run) is played with the settings it was trained with (its config.json: env,
agent, rollout), unless --config-name is given; --env NAME then swaps in that env's own config. Arguments with '='
are overrides of that config (Hydra overrides of the composed config with --config-name, default base, when no
model comes from a run); the others are the one or two models. Episode i of every env is played on seed
rollout.val_seed + i by every model."""


def parse_args(argv: list[str] | None = None, prog: str = "python -m ragen.eval") -> argparse.Namespace:
    """The parsed command line; models and overrides may be interleaved with the options."""
    p = argparse.ArgumentParser(
        prog=prog, epilog=EXAMPLES.replace("python -m ragen.eval", prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Evaluate one model, or compare two, on fixed env seeds with 95% intervals.")
    p.add_argument("items", nargs="+", metavar="MODEL | key=value",
                   help="one or two models (run folder, checkpoint folder, model folder, alias, hub id or "
                        "openai:<model>), then Hydra overrides such as agent.think=false")
    p.add_argument("--env", action="append", dest="envs", metavar="NAME",
                   help="an env by name: a config under config/env/ (sokoban, frozen_lake_3x3, ...) or a registered "
                        "env, plugins included (repeatable; default: the config's env)")
    p.add_argument("--n", type=int, default=200, help="episodes per env (default 200)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0 = greedy)")
    p.add_argument("--batch-size", type=int, default=32, help="episodes per proxy call (default 32)")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write every number to this JSON file")
    p.add_argument("--config-name", default=None,
                   help="config under config/ to compose (default: the run's saved config.json when a model is a "
                        "run or checkpoint folder, else base)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint of openai:<model> arguments")
    p.add_argument("--api-key-env", metavar="NAME",
                   help="environment variable holding the API key (default OPENAI_API_KEY, optional)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--log", metavar="PATH", help="where library warnings and messages (transformers, torch) go "
                                                 "instead of the console (default: the --json path with .log, "
                                                 "else they are not kept)")
    p.add_argument("--verbose", action="store_true", help="library warnings and messages on the console")
    return p.parse_intermixed_args(argv)


def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """(models, overrides): an item with ``=`` that is not an existing path or ``openai:`` model is an override."""
    overrides = [x for x in items if "=" in x and not x.startswith("openai:") and not Path(x).expanduser().exists()]
    models = [x for x in items if x not in overrides]
    if not 1 <= len(models) <= 2:
        raise ModelArgError(f"give one or two models (to compare), got {len(models)}: {models}; "
                            "arguments with '=' are config overrides")
    return models, overrides


def check_numbers(args: argparse.Namespace) -> None:
    """``--n``, ``--batch-size`` >= 1 and ``--temperature`` >= 0, else a ``ConfigError`` naming the option."""
    counts = (("n", args.n), ("batch-size", args.batch_size))
    problems = [f"--{name} must be >= 1, got {value}" for name, value in counts if value < 1]
    if args.temperature < 0:
        problems.append(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if problems:
        raise ConfigError(problems)


def prepare(args: argparse.Namespace) -> tuple[list[ModelSpec], dict[str, TrainConfig], list[str]]:
    """(model specs, env name -> composed config, overrides); raises ``ConfigError`` / ``ModelArgError``."""
    check_numbers(args)
    models, overrides = split_items(args.items)
    clash = [o for o in overrides if o.lstrip("+").startswith("env=")]
    if clash and args.envs:
        raise ConfigError([f"override {clash[0]} conflicts with --env; select envs with --env NAME only"])
    cache = next((o.split("=", 1)[1] for o in overrides if o.startswith("model.cache_dir=")), None)
    specs = resolve_model_args(models, base_url=args.base_url, api_key_env=args.api_key_env, cache_dir=cache)
    saved = run_config(specs) if args.config_name is None else None
    args.config_name = args.config_name or ("base" if saved is None else f"run config {saved}")
    configs: dict[str, TrainConfig] = {}
    for env in dict.fromkeys(args.envs or [None]):  # unique, in order; None = the config's env
        cfg = env_config(args.config_name, overrides, env) if saved is None else saved_config(saved, overrides, env)
        configs[cfg.env.name] = cfg
    return specs, configs, overrides


def run_config(specs: list[ModelSpec]) -> str | None:
    """The saved ``config.json`` of the run(s) the models come from (None: no model comes from a run). Two runs
    trained with other env, agent or rollout settings cannot share one evaluation: a ``ConfigError`` names the
    differing keys and the fix (``--config-name``)."""
    import json

    paths = list(dict.fromkeys(s.run_config for s in specs if s.run_config))
    if len(paths) > 1:
        a, b = (json.loads(open(p).read()) for p in paths)
        diff = [f"{sec}.{k}" for sec in ("env", "agent", "rollout") for k in sorted(set(a[sec]) | set(b[sec]))
                if a[sec].get(k) != b[sec].get(k)]
        if diff:
            raise ConfigError([f"the two runs were trained with other settings ({', '.join(diff[:8])}): pass "
                               "--config-name NAME (and overrides) to evaluate both with one config"])
    return paths[0] if paths else None


def run(args: argparse.Namespace, specs: list[ModelSpec], configs: dict[str, TrainConfig],
        overrides: list[str]) -> dict[str, Any]:
    """Evaluate every model on every env and return the report (``ragen.evaluation.report.build_report``)."""
    from tqdm import tqdm

    first = next(iter(configs.values()))  # engine settings (device, dtype, engine) are shared by all envs
    episodes: dict[str, list] = {name: [] for name in configs}
    for i, spec in enumerate(specs):
        engine, tokenizer = build_model(spec, first)
        for name, cfg in configs.items():
            with tqdm(total=args.n, desc=f"model {i + 1} {name}", unit="ep", disable=args.no_progress,
                      dynamic_ncols=True) as bar:
                episodes[name].append(evaluate_env(engine, tokenizer, cfg, n=args.n, temperature=args.temperature,
                                                   batch_size=args.batch_size, progress=bar.update))
        del engine
        release_memory()
    envs = {name: env_report(describe_env(configs[name], args.temperature), runs) for name, runs in episodes.items()}
    return build_report([s.to_dict() for s in specs], envs, config_name=args.config_name, overrides=overrides,
                        n=args.n, temperature=args.temperature, batch_size=args.batch_size,
                        val_seed=first.rollout.val_seed)


def main(argv: list[str] | None = None, prog: str = "python -m ragen.eval") -> int:
    """Entry point: 0 on success, 2 on a bad argument or config (one line per problem on stderr). Library
    warnings and messages stay off the console (``--log``, ``--verbose``; ``ragen.utils.console``)."""
    import contextlib

    from ragen.utils.console import library_messages_to

    args = parse_args(argv, prog)
    log = args.log or (str(Path(args.json_path).with_suffix(".log")) if args.json_path else None)
    try:
        with contextlib.nullcontext() if args.verbose else library_messages_to(log):
            specs, configs, overrides = prepare(args)
            report = run(args, specs, configs, overrides)
    except (ConfigError, ModelArgError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(format_table(report))
    if args.json_path:
        print(f"[ragen] wrote {write_json(report, args.json_path)}")
    return 0
