"""Device recipes and env selection: the CPU demo's tuning stays what the learning checks measured, ``trainer=gpu``
gives every launch script the published settings for real models on 8 GPUs, the precedence of config layers is the
one config/base.yaml documents, and ``env=<name>`` brings that env's own defaults into every experiment."""

import json
from pathlib import Path

import pytest
import yaml

from ragen.launch import validate
from ragen.trainer.config.compose import compose, config_dir, load_train_config, to_train_config
from ragen.trainer.config.resource_checks import flatten as flat
from ragen.trainer.config.run_shape import train_batch_size, world_size
from ragen.trainer.config.schema import SECTIONS, ConfigError, default_section_values

CONFIG = config_dir()
ROOT = CONFIG.parent
PINS = json.loads((Path(__file__).parent / "data" / "cpu_config_pins.json").read_text())
GAME = "env.config.game_path=/data/games/detective.z5"  # text_adventure's required file (never opened here)
PROGRAM = "ragen.gateway.examples.calculator:run"  # agent_program's required entry (the shipped example)
# launch script -> the configs it runs (scripts/train_search_qa.sh: one per run, scripts/train_archer.sh: default)
LAUNCH = {"train_ppo.sh": ["ppo_bandit"], "train_ppo_multi_turn.sh": ["ppo_multi_turn"],
          "train_ppo_bilevel.sh": ["ppo_bilevel"],
          "scripts/train_search_qa.sh": [f"search_qa_{r}" for r in ("ms_grpo", "ms_po", "grpo_outcome", "grpo_step")],
          "scripts/train_archer.sh": ["archer_twenty_questions"]}
LAUNCH_CONFIGS = [c for cs in LAUNCH.values() for c in cs]
ENV_FILES = sorted(p.stem for p in (CONFIG / "env").glob("*.yaml"))
GPU8 = ["trainer=gpu", "trainer.use_ray=true", "trainer.n_gpus_per_node=8", "rollout.engine=vllm",
        "model.path=/models/Qwen2.5-3B-Instruct"]




def cpu_tuning(name: str) -> dict:
    """Config ``name`` composed on CPU, as the keys whose values differ from the schema's defaults (JSON values)."""
    cfg = to_train_config(compose(name, [GAME] if name == "archer_text_adventure" else []))
    defaults = json.loads(json.dumps(flat({s: default_section_values(s) for s in SECTIONS})))
    composed = json.loads(json.dumps(flat({k: v for k, v in cfg.to_dict().items() if k != "imports"})))
    return {k: v for k, v in composed.items() if defaults.get(k, object()) != v}


@pytest.mark.parametrize("name", sorted(PINS))
def test_cpu_configs_are_unchanged(name):
    """Every config's CPU composition equals the one the learning checks were measured with: the keys that differ
    from the defaults and their values, pinned in tests/data/cpu_config_pins.json (archer_twenty_questions_paper is
    GPU-sized on any device and not pinned). A deliberate change of a CPU recipe is re-measured (README "Learning
    checks") and the file rewritten from :func:`cpu_tuning`."""
    assert cpu_tuning(name) == PINS[name]


def test_every_cpu_config_is_pinned():
    primary = {p.stem for p in CONFIG.glob("*.yaml")}
    assert primary - set(PINS) == {"archer_twenty_questions_paper"}


def _experiment_dir(tmp_path, monkeypatch) -> Path:
    """A copy of config/ with an experiment ``prec`` and its recipes, each setting keys the layers below set."""
    import shutil

    root = tmp_path / "config"
    shutil.copytree(CONFIG, root)
    (root / "prec.yaml").write_text(yaml.safe_dump({
        "defaults": ["base", "_self_", {"recipe": "prec_${trainer}"}],
        "agent": {"max_new_tokens": 100}, "actor": {"mini_batch_size": 16}, "trainer": {"total_steps": 7}}))
    for dev, tokens in (("cpu", 50), ("gpu", 500)):
        (root / "recipe" / f"prec_{dev}.yaml").write_text(
            "# @package _global_\n" + yaml.safe_dump({"agent": {"max_new_tokens": tokens, "top_p": 0.5}}))
    (root / "prec_leaf.yaml").write_text(yaml.safe_dump({"defaults": ["prec", "_self_"], "agent": {"top_p": 0.9}}))
    monkeypatch.setenv("RAGEN_CONFIG_DIR", str(root))
    return root


@pytest.mark.parametrize("dev", ["cpu", "gpu"])
def test_precedence_command_line_recipe_experiment_groups_base(tmp_path, monkeypatch, dev):
    """agent.max_new_tokens is set by base (128), the trainer group (cpu 64 / gpu 400), the experiment (100) and the
    recipe (cpu 50 / gpu 500): the recipe wins, the command line beats it. actor.mini_batch_size: base / gpu group
    (8 / 32) < experiment (16). rollout.engine: base hf < group (gpu: vllm). agent.top_k: base only. agent.top_p: recipe
    (0.5) < a config inheriting the experiment (0.9)."""
    _experiment_dir(tmp_path, monkeypatch)
    cfg = to_train_config(compose("prec", [f"trainer={dev}"]))
    assert cfg.agent.max_new_tokens == {"cpu": 50, "gpu": 500}[dev]
    assert cfg.actor.mini_batch_size == 16 and cfg.trainer.total_steps == 7
    assert cfg.rollout.engine == {"cpu": "hf", "gpu": "vllm"}[dev] and cfg.agent.top_k == 0
    assert cfg.critic.mini_batch_size == {"cpu": 8, "gpu": 32}[dev]  # base's (cpu) or the group's (gpu), nothing above
    cli = to_train_config(compose("prec", [f"trainer={dev}", "agent.max_new_tokens=7", "actor.mini_batch_size=4"]))
    assert (cli.agent.max_new_tokens, cli.actor.mini_batch_size) == (7, 4)
    other = to_train_config(compose("prec", [f"trainer={dev}", "recipe=prec_cpu"]))  # a recipe is a group choice
    assert other.agent.max_new_tokens == 50
    # a config inheriting the experiment comes after the experiment's recipe: agent.top_p 0.9 (recipe: 0.5)
    leaf = to_train_config(compose("prec_leaf", [f"trainer={dev}"]))
    assert (leaf.agent.top_p, leaf.agent.max_new_tokens, cfg.agent.top_p) == (0.9, {"cpu": 50, "gpu": 500}[dev], 0.5)


@pytest.mark.parametrize("dev", ["cpu", "gpu"])
def test_precedence_in_the_shipped_configs(dev):
    """ppo_multi_turn: actor.lr is 1e-6 in base.yaml, 1e-5 in trainer/cpu.yaml and the recipe's (cpu 5e-5, gpu
    1e-6, RAGEN's); the command line beats the recipe; a command-line env choice replaces the experiment's env file
    (frozen_lake_3x3, 3 turns) with the chosen one (sokoban, 5 turns)."""
    cfg = load_train_config("ppo_multi_turn", [f"trainer={dev}"])
    assert cfg.actor.lr == {"cpu": 5e-5, "gpu": 1e-6}[dev]
    assert (cfg.env.name, cfg.env.max_turn, cfg.env.config["size"]) == ("frozen_lake", 3, 3)
    assert cfg.algorithm.skip_env_tokens is True  # the schema default, on both devices
    assert load_train_config("ppo_multi_turn", [f"trainer={dev}", "actor.lr=3e-5"]).actor.lr == 3e-5
    sokoban = load_train_config("ppo_multi_turn", [f"trainer={dev}", "env=sokoban"])
    assert (sokoban.env.name, sokoban.env.max_turn) == ("sokoban", 5) and "size" not in sokoban.env.config
    check = load_train_config("bandit_gae_learning_check", [f"trainer={dev}"])  # inherits ppo_bandit: its own lr
    assert (check.actor.lr, check.env.config["high_prob"]) == (2e-5, 1.0)


@pytest.mark.parametrize("name", LAUNCH_CONFIGS)
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_gpu_recipes_validate_on_gpu_nodes(name, gpus):
    """trainer=gpu is enough: every launch config validates on 1-8 GPUs with Ray workers and the vLLM engine, and
    its batch arithmetic holds (mini-batches divide the train batch, world sizes divide mini-batches)."""
    cfg = load_train_config(name, [*GPU8, f"trainer.n_gpus_per_node={gpus}"])
    validate(cfg)
    assert cfg.trainer.use_ray and cfg.rollout.engine == "vllm" and world_size(cfg, "actor") == gpus
    assert cfg.agent.think and cfg.agent.response_prefix == "" and cfg.agent.max_new_tokens >= 400
    mini, micro = cfg.actor.mini_batch_size, cfg.actor.micro_batch_size
    assert mini % gpus == 0 and (mini // gpus) % micro == 0
    batch = cfg.archer.batch_size if cfg.algorithm.name != "ppo" else train_batch_size(cfg)
    assert batch % mini == 0


def test_readme_gpu_example_validates():
    """The README's GPU command (bash train_ppo_bilevel.sh trainer=gpu trainer.use_ray=true
    trainer.n_gpus_per_node=8 rollout.engine=vllm model.path=/models/Qwen2.5-3B-Instruct)."""
    validate(load_train_config("ppo_bilevel", GPU8))


def test_ppo_gpu_recipes_are_ragens():
    """RAGEN's config/base.yaml (+ verl's lrs): thinking, 400 tokens a turn in 3600, 8 groups of 16, the top 25% of
    groups by reward std, mini-batches of 32, lr 1e-6 / 1e-5, entropy 0.001, 200 steps, validation every 10 steps
    on 256 episodes at temperature 0.5; no CPU tuning left (warm start, shared backbone, in-process workers)."""
    for name in ("ppo_multi_turn", "ppo_bilevel", "ppo_bandit"):
        cfg = load_train_config(name, ["trainer=gpu"])
        assert (cfg.agent.max_model_len, cfg.agent.reminder) == (3600, "every_turn")
        assert cfg.agent.max_new_tokens == (500 if name == "ppo_bandit" else 400)
        assert (cfg.rollout.n_groups, cfg.rollout.group_size, cfg.algorithm.rollout_filter_ratio) == (8, 16, 0.25)
        assert (cfg.rollout.val_n_groups, cfg.rollout.val_temperature) == (256, 0.5)
        assert (cfg.actor.lr, cfg.critic.lr, cfg.actor.entropy_coef, cfg.actor.mini_batch_size) == (1e-6, 1e-5,
                                                                                                     0.001, 32)
        assert (cfg.trainer.total_steps, cfg.trainer.val_freq, cfg.trainer.sft_warmup_steps) == (200, 10, 0)
        assert not cfg.critic.share_backbone and not cfg.actor.use_kl_loss and not cfg.algorithm.kl_in_reward


def test_search_qa_gpu_recipe_is_the_papers():
    """MS-GRPO's runs: lr 1e-6, 21 generations of 16 questions (336 = 12 x 7 GPUs x 4 accumulation steps) in one
    mini-batch, 2 iterations, no KL (beta 0: no reference model), step advantage coefficient 1, 150 rollout batches
    (300 optimizer steps)."""
    for run in ("ms_grpo", "ms_po", "grpo_outcome", "grpo_step"):
        cfg = load_train_config(f"search_qa_{run}", GPU8)
        assert (cfg.actor.lr, cfg.rollout.group_size, cfg.rollout.n_groups, cfg.actor.mini_batch_size) == (
            1e-6, 21, 16, 336)
        assert (cfg.actor.ppo_epochs, cfg.algorithm.step_advantage_coef, cfg.trainer.total_steps) == (2, 1.0, 150)
        assert (cfg.actor.betas, cfg.actor.grad_clip, cfg.actor.warmup_steps) == ((0.9, 0.99), 0.1, 20)
        assert not cfg.actor.use_kl_loss and not cfg.algorithm.kl_in_reward and cfg.ref.enable is not True
    assert load_train_config("search_qa_ms_grpo", ["trainer=cpu"]).rollout.group_size == 4


@pytest.mark.parametrize("name", ["ppo_multi_turn", "ppo_bilevel", "ppo_bandit", "search_qa_ms_grpo"])
def test_gpu_recipes_correct_the_vllm_gap_and_the_plan_says_so(name):
    """trainer=gpu samples with vLLM in bf16: its recipes weight the policy loss by min(pi_old / pi_engine, 2)
    (token_tis); the CPU recipes (fp32 on both sides) leave it off. The start-up block names the mode and its keys."""
    from ragen.trainer.builders import startup_block

    gpu, cpu = load_train_config(name, GPU8), load_train_config(name, ["trainer=cpu"])
    assert (gpu.algorithm.rollout_correction.mode, gpu.algorithm.rollout_correction.clip) == ("token_tis", 2.0)
    assert cpu.algorithm.rollout_correction.mode == "none"
    assert ", rollout correction token_tis (clip 2.0)" in startup_block(gpu, "m")
    assert "rollout correction" not in startup_block(cpu, "m")


def test_archer_gpu_recipe_is_the_reference_loop():
    """scripts/train_archer.sh trainer=gpu: the reference code's loop (128 trajectories, 50 critic / 3 actor steps
    of 256 turns, 20 warm-up iterations, lrs 2e-5 / 1e-6, tau 0.1); the paper config plays 20 questions on the full
    table with that loop on any device."""
    for name, turns in (("archer_twenty_questions", 4), ("archer_twenty_questions_paper", 20)):
        cfg = load_train_config(name, ["trainer=gpu"])
        validate(load_train_config(name, GPU8))
        a = cfg.archer
        assert (a.critic_epochs, a.actor_epochs, a.warmup_iter, a.batch_size, a.tau) == (50, 3, 20, 256, 0.1)
        assert (cfg.critic.lr, cfg.actor.lr, cfg.rollout.n_groups, cfg.env.max_turn) == (2e-5, 1e-6, 128, turns)
    paper = load_train_config("archer_twenty_questions_paper")  # trainer=cpu: still the reference loop
    assert (paper.archer.critic_epochs, paper.env.config["objects_path"]) == (50, None)
    assert (paper.agent.think, paper.agent.max_new_tokens) == (False, 32)  # the reference's utterances


def _env_file(name: str) -> dict:
    """The env section ``config/env/<name>.yaml`` composes to (a variant merged over its env's file)."""
    from ragen.trainer.config.env_mix import _env_file as composed_env_file

    return composed_env_file(name)


# What a launch config x env pair may fail validation with (each message names the key and the fix): an estimator
# that needs search_qa's reward split, a warm start on an env without an expert, episodes longer than the budget.
# the user's own game file (text_adventure's game_path stands in for it) is checked when validation builds the env
INCOMPATIBLE = ("needs an env that reports step and outcome rewards", "needs an env with an expert", "prompt budget",
                "game file '/data/games/detective.z5' does not exist", "cannot train env=agent_program",
                "takes free-text actions (it has no action_list()")


def noisy_warm_start(cfg) -> bool:
    return cfg.trainer.sft_warmup_steps > 0 and cfg.sft.noise > 0


@pytest.mark.parametrize("name", LAUNCH_CONFIGS)
def test_env_selection_brings_the_envs_own_defaults(name):
    """Every launch config x every env file, on CPU and GPU: the env section is exactly that file (name, turns,
    config: nothing of the experiment's env leaks in). On CPU each pair validates or fails only for a real
    incompatibility; the core envs validate with every experiment that does not need search_qa's reward split."""
    for env in ENV_FILES:
        extra = {"text_adventure": [GAME], "agent_program": [f"env.config.entry={PROGRAM}"]}.get(env, [])
        expected = _env_file(env)
        if env == "text_adventure":
            expected["config"]["game_path"] = "/data/games/detective.z5"
        if env == "agent_program":
            expected["config"]["entry"] = PROGRAM
        cfgs = {dev: load_train_config(name, [f"env={env}", f"trainer={dev}", *extra]) for dev in ("cpu", "gpu")}
        for dev, cfg in cfgs.items():
            got = {"name": cfg.env.name, "max_turn": cfg.env.max_turn,
                   "max_actions_per_turn": cfg.env.max_actions_per_turn, "config": dict(cfg.env.config)}
            assert got == expected, (name, env, dev)
        try:
            validate(cfgs["cpu"])
        except ConfigError as exc:
            assert all(any(k in p for k in INCOMPATIBLE) for p in exc.problems), (name, env, exc.problems)
            split = name.startswith(("search_qa_ms", "search_qa_grpo_outcome"))
            assert env not in ("bandit", "frozen_lake", "sokoban") or split, (name, env, exc.problems)
            # countdown's actions are free text: only a warm start with random actions (sft.noise > 0) refuses it
            assert env != "countdown" or split or noisy_warm_start(cfgs["cpu"]), (name, env, exc.problems)


def test_no_experiment_sets_env_keys():
    """Env settings live in config/env/ files only (an experiment selects one with `override env: <file>`)."""
    for path in CONFIG.glob("*.yaml"):
        if path.stem != "base":
            assert "env" not in (yaml.safe_load(path.read_text()) or {}), path.name
    for path in (CONFIG / "recipe").glob("*.yaml"):
        assert "env" not in (yaml.safe_load(path.read_text()) or {}), path.name


def test_every_recipe_is_used_and_composes():
    """Each recipe file is some experiment's choice for a device (or included by one), and composes on it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    chosen = set()
    with initialize_config_dir(config_dir=str(CONFIG), version_base="1.3"):
        for name in [p.stem for p in CONFIG.glob("*.yaml") if p.stem != "base"]:
            for dev in ("cpu", "gpu"):
                cfg = hydra_compose(name, [f"trainer={dev}"], return_hydra_config=True)
                recipe = cfg.hydra.runtime.choices.get("recipe")
                chosen |= _recipe_closure(recipe) if recipe else set()
    assert len(chosen) >= 10 and chosen == {p.stem for p in (CONFIG / "recipe").glob("*.yaml")}


def _recipe_closure(name: str) -> set[str]:
    raw = yaml.safe_load((CONFIG / "recipe" / f"{name}.yaml").read_text()) or {}
    out = {name}
    for entry in raw.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            out |= _recipe_closure(entry)
    return out


def test_env_that_needs_an_absent_extra_names_it(monkeypatch):
    """text_adventure without jericho (its `text_adventure` extra): validation fails naming the extra to install."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "jericho" else real(n, *a))
    cfg = load_train_config("ppo_multi_turn", ["env=text_adventure", GAME, "trainer.sft_warmup_steps=0"])
    expected = r"env text_adventure needs the jericho package: install extra text_adventure, pip install 'ragen\[text_"
    with pytest.raises(ConfigError, match=expected):
        validate(cfg)


SCRIPT_CONFIG = {"train_ppo.sh": "ppo_bandit", "train_ppo_multi_turn.sh": "ppo_multi_turn",
                 "train_ppo_bilevel.sh": "ppo_bilevel", "scripts/train_archer.sh": "archer_twenty_questions"}
STAND_INS = {"<policy-dir>": "/models/policy", "<sft-run-dir>": "/models/policy"}


def header_commands() -> list[tuple[str, list[str]]]:
    """``(file, argv)`` of every ``bash <launch script> ...`` line in the launch scripts' and the configs' headers."""
    import shlex

    files = [*(ROOT / s for s in LAUNCH), *sorted(CONFIG.glob("*.yaml"))]
    out = []
    for path in files:
        for line in path.read_text().splitlines():
            if not line.startswith("#") or "bash " not in line:
                continue
            text = line.split("bash ", 1)[1].split("#", 1)[0]
            if "[key=value" in text or "{" in text:  # a usage line, not a command
                continue
            for old, new in STAND_INS.items():
                text = text.replace(old, new)
            argv = shlex.split(text)
            if argv and argv[0].endswith(".sh") and argv[0] in (*LAUNCH, "train_archer.sh"):
                out.append((path.name, argv))
    return out


def test_header_commands_compose_and_validate():
    """Every launch command the scripts' and configs' headers show composes and passes validation (GPU ones
    included: validation needs no GPU)."""
    commands = header_commands()
    assert len(commands) >= 15 and {a[0] for _, a in commands} >= set(LAUNCH)
    for where, (script, *args) in commands:
        if script == "scripts/train_search_qa.sh":
            name, args = f"search_qa_{args[0]}", args[1:]
        elif "--config-name" in args:
            i = args.index("--config-name")
            name, args = args[i + 1], args[:i] + args[i + 2:]
        else:
            name = SCRIPT_CONFIG[script]
        try:
            validate(load_train_config(name, args))
        except ConfigError as exc:  # a placeholder for the user's own game file is all that may fail
            if not all("game file '/path/to/" in p for p in exc.problems):
                raise AssertionError(f"{where}: bash {script} {' '.join(args)}: {exc}") from exc
        except Exception as exc:
            raise AssertionError(f"{where}: bash {script} {' '.join(args)}: {exc}") from exc
