"""2-3-iteration end-to-end runs of ArCHer, online CHAI and online filtered BC with the tiny policy and tiny encoder;
resume equals an uninterrupted run; config errors name the key."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import assert_all_finite, load_actor_weights, read_metrics, rss_without_growth, tiny_init_weights

from ragen.archer.critic import ArcherCriticWorker
from ragen.archer.main import run
from ragen.archer.trainer import critic_settings
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _overrides(out: Path, steps: int = 2, ray: bool = False) -> list[str]:
    return [
        "model=tiny", "critic.encoder=tiny", "critic.head_hidden=16", f"trainer.output_dir={out}",
        f"trainer.total_steps={steps}", "trainer.loggers=[console,jsonl]", "trainer.progress_bar=false",
        "agent.max_new_tokens=12", "rollout.n_groups=2", "rollout.val_n_groups=1", "actor.mini_batch_size=4",
        "actor.micro_batch_size=2", "archer.batch_size=4", "archer.critic_epochs=2", "archer.warmup_iter=1",
        "archer.actor_epochs=1",  # pinned: the default config's loop sizes change with its measurements
        "actor.lr=1e-3", "critic.lr=1e-3", "trainer.num_threads=1", "actor.mixed_precision=fp32",
        "rollout.dtype=float32", f"trainer.use_ray={str(ray).lower()}", "env.max_turn=2", "trainer.save_freq=1",
        "trainer.keep_last_ckpt=null", "trainer.val_before_train=false",
        "trainer.sft_warmup_steps=0",  # the warm start has its own test (test_archer_warm_start.py)
    ]


def _critic_state(ckpt: Path) -> dict:
    return torch.load(ckpt / "critic" / "critic.pt", weights_only=False)["online"]


def _changed(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k].float(), b[k].float()) for k in a)


def _fresh_critic(cfg) -> dict:
    return ArcherCriticWorker(critic_settings(cfg)).online.state_dict()


@pytest.mark.slow
def test_launcher_runs_archer_three_iterations_in_ray_workers_without_memory_growth(tmp_path, subprocess_env):
    """``scripts/train_archer.sh`` end to end (policy and critic as Ray actors): exit 0, both models changed, and
    no process's RSS grows from iteration 2 to 3 (both update the actor, after ``warmup_iter=1``), as the PPO
    memory test (``tests/trainer/test_memory.py``) checks for its workers."""
    cmd = ["bash", str(ROOT / "scripts" / "train_archer.sh"), *_overrides(tmp_path, steps=3, ray=True)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    cfg = load_train_config("archer_twenty_questions", _overrides(tmp_path, ray=True))
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    last = records[-1]
    assert last["step"] == 3 and "actor/pg_loss" in last and "critic/q_loss" in last
    assert last["buffer/size"] == 12  # 3 iterations x 2 episodes x 2 turns
    assert [r["step"] for r in records if "memory/driver_rss_gb" in r] == [1, 2, 3]
    rss_without_growth(records)
    ckpt = tmp_path / "checkpoints" / "global_step_3"
    assert _changed(tiny_init_weights(), load_actor_weights(ckpt))
    assert _changed(_fresh_critic(cfg), _critic_state(ckpt))
    assert (tmp_path / "learning_curve.png").is_file() and (ckpt / "buffer.json").is_file()


@pytest.mark.slow
def test_chai_trains_the_critic_and_leaves_the_policy(tmp_path):
    cfg = load_train_config("chai_twenty_questions", [*_overrides(tmp_path), "archer.chai_candidates=3"])
    run(cfg)
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    assert not any(k.startswith("actor/") for r in records for k in r)
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    init, trained = tiny_init_weights(), load_actor_weights(ckpt)
    assert not _changed(init, trained)  # CHAI never updates the policy
    assert _changed(_fresh_critic(cfg), _critic_state(ckpt))


@pytest.mark.slow
def test_filtered_bc_updates_the_policy_without_a_critic(tmp_path):
    cfg = load_train_config("filtered_bc_twenty_questions", _overrides(tmp_path))
    run(cfg)
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    last = records[-1]
    assert "sft/loss" in last and last["bc/kept_turns"] >= 1 and not any(k.startswith("critic/") for k in last)
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    assert not (ckpt / "critic").exists()
    assert _changed(tiny_init_weights(), load_actor_weights(ckpt))


@pytest.mark.slow
def test_archer_trains_lora_adapters_on_a_frozen_base(tmp_path):
    """``actor.lora_rank`` reaches the ArCHer policy (a ``PolicyWorker``): the checkpoint holds merged weights that
    moved, plus the adapters; resuming from it restores base + adapters."""
    overrides = [*_overrides(tmp_path), "actor.lora_rank=4", "actor.lr=5e-2"]
    run(load_train_config("archer_twenty_questions", overrides))
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    assert "actor/pg_loss" in records[-1]
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    assert (ckpt / "actor" / "lora" / "adapter.safetensors").is_file()
    assert _changed(tiny_init_weights(), load_actor_weights(ckpt))


@pytest.mark.slow
def test_resume_equals_an_uninterrupted_run(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run(load_train_config("archer_twenty_questions", _overrides(full, steps=2)))
    run(load_train_config("archer_twenty_questions", _overrides(part, steps=1)))
    run(load_train_config("archer_twenty_questions", _overrides(part, steps=2)))  # resumes at iteration 1
    a, b = full / "checkpoints" / "global_step_2", part / "checkpoints" / "global_step_2"
    wa, wb = load_actor_weights(a), load_actor_weights(b)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    ca, cb = _critic_state(a), _critic_state(b)
    assert all(torch.allclose(ca[k], cb[k], atol=1e-6) for k in ca)
    assert (a / "buffer.json").read_text() == (b / "buffer.json").read_text()


@pytest.mark.slow
def test_bad_archer_config_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="archer.tau"):
        load_train_config("archer_twenty_questions", ["archer.tau=0"])
    from ragen.archer.main import validate_archer

    with pytest.raises(ConfigError, match="agent.layout"):
        validate_archer(load_train_config("archer_twenty_questions", ["agent.layout=trajectory"]))
    with pytest.raises(ConfigError, match="critic.head_hidden=0"):
        validate_archer(load_train_config("archer_twenty_questions", ["critic.head_hidden=0"]))
    with pytest.raises(ConfigError, match="algorithm.name='ppo' is not in the ArCHer family"):
        validate_archer(load_train_config("archer_twenty_questions", ["algorithm.name=ppo"]))
    with pytest.raises(ConfigError, match="archer.batch_size=3 must be a multiple of trainer.critic_world_size=2"):
        validate_archer(load_train_config("archer_twenty_questions", ["archer.batch_size=3", "actor.mini_batch_size=1",
                                                                      "actor.micro_batch_size=1",
                                                                      "trainer.critic_world_size=2"]))
    from ragen.launch import validate

    with pytest.raises(ConfigError, match="agent.layout"):  # ragen.train's check runs the ArCHer family's checks
        validate(load_train_config("chai_twenty_questions", ["agent.layout=trajectory"]))
    proc = subprocess.run([sys.executable, "-m", "ragen.archer", "algorithm.name=dqn",
                           f"trainer.output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "algorithm.name='dqn' is unknown" in proc.stderr


def test_ragen_train_hands_the_archer_family_to_its_trainer(monkeypatch):
    """``python -m ragen.train`` with algorithm.name=chai runs ``ragen.archer.main.run`` (not the PPO trainer):
    ``ragen.launch.run`` dispatches on algorithm.name; the PPO family's own run refuses the config."""
    import ragen.archer.main
    from ragen import launch
    from ragen.ppo import trainer

    seen = []
    monkeypatch.setattr(ragen.archer.main, "run", lambda cfg: seen.append(cfg.algorithm.name) or {"done": 1.0})
    assert launch.run(load_train_config("base", ["algorithm.name=chai"])) == {"done": 1.0}
    assert seen == ["chai"]
    with pytest.raises(ConfigError, match="algorithm.name='chai' is not the PPO family"):
        trainer.run(load_train_config("base", ["algorithm.name=chai"]))


def test_critic_section_keys_reach_the_critic_worker():
    """``critic.freeze_encoder`` / ``critic.encoder`` / ``critic.lr`` ... of the config are the worker's settings."""
    cfg = load_train_config("archer_twenty_questions", ["critic.freeze_encoder=true", "critic.encoder=tiny",
                                                         "critic.lr=3e-4", "critic.head_hidden=32", "archer.tau=0.2"])
    s = critic_settings(cfg)
    assert (s.freeze_encoder, s.encoder, s.lr, s.hidden, s.tau, s.gamma) == (True, "tiny", 3e-4, 32, 0.2, 0.95)


ARCHER_CONFIGS = sorted(p.stem for p in (ROOT / "config").glob("*.yaml")
                        if p.stem.startswith(("archer_", "chai_", "filtered_bc_")))


@pytest.mark.parametrize("name", ARCHER_CONFIGS)
def test_archer_configs_validate(name, tmp_path):
    from ragen.archer.main import validate_archer

    game = tmp_path / "detective.z5"  # validation builds the env, which checks that the game file exists
    game.write_bytes(b"")
    extra = [f"env.config.game_path={game}"] if "text_adventure" in name else []
    cfg = load_train_config(name, extra)
    validate_archer(cfg)
    assert cfg.agent.layout == "turn"
    expected = "chai" if name.startswith("chai") else "filtered_bc" if name.startswith("filtered_bc") else "archer"
    assert cfg.algorithm.name == expected
    assert cfg.rollout.val_temperature == 0.0  # every member validates the same way: greedy (CHAI: ragen.archer.chai)
    if "text_adventure" in name:  # the reference's Detective horizon: 50 commands
        assert (cfg.env.max_turn, cfg.env.config["max_steps"]) == (50, 50)
    if name.endswith("_paper"):
        a = cfg.archer
        assert (a.critic_epochs, a.actor_epochs, a.warmup_iter, a.capacity, a.tau, a.gamma) == (50, 3, 20, 100000,
                                                                                                 0.1, 0.95)
        assert cfg.rollout.n_groups * cfg.rollout.group_size == 128
        # the reference code's 20q settings: 8 x 32 accumulated turns per step, lrs, clip, Adam, evaluation size
        assert (a.batch_size, cfg.actor.mini_batch_size, cfg.critic.lr, cfg.actor.lr) == (256, 256, 2e-5, 1e-6)
        c, act = cfg.critic, cfg.actor
        assert (c.weight_decay, act.weight_decay, c.grad_clip, act.grad_clip) == (0, 0, 1, 1)
        assert (cfg.agent.temperature, cfg.agent.max_new_tokens, cfg.rollout.val_n_groups) == (1.0, 32, 32)
