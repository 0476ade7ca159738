"""Each validation rule has a config that triggers it, and its message names the key."""

import importlib.util
from dataclasses import replace

import pytest
import torch

from ragen.algorithms import ADVANTAGE_ESTIMATORS, compute_advantage
from ragen.algorithms.reference import random_inputs
from ragen.launch import validate
from ragen.trainer.config.compose import compose, load_train_config, to_train_config
from ragen.trainer.config.schema import ConfigError

CASES = [
    # (overrides, text the message must contain)
    (["env.name=no_such_env"], "env.name='no_such_env' is unknown; registered envs: agent_program, bandit"),
    (["+env.config.bogus=1"], "env.config has unknown key(s) ['bogus'] for env 'bandit'"),
    (["env.max_turn=0"], "env.max_turn=0 must be >= 1"),
    (["env.max_actions_per_turn=0"], "env.max_actions_per_turn=0 must be >= 1"),
    (["algorithm.estimator=ppo2"], "algorithm.estimator='ppo2' is unknown; registered estimators: gae"),
    (["critic.enable=false"], "algorithm.estimator='gae' needs a critic (values) but critic.enable=false"),
    (["algorithm=grpo", "rollout.group_size=1", "actor.mini_batch_size=4", "actor.micro_batch_size=1"],
     "needs rollout.group_size >= 2"),
    (["algorithm.rollout_filter_ratio=0"], "algorithm.rollout_filter_ratio=0.0 must be in (0, 1]"),
    (["algorithm.return_mode=mc"], "algorithm.return_mode='mc' is unknown"),
    (["algorithm.kl_kind=k9"], "algorithm.kl_kind='k9' is unknown"),
    (["actor.use_kl_loss=true", "ref.enable=false"], "a KL term is on (actor.use_kl_loss or algorithm.kl_in_reward)"),
    (["actor.lora_rank=8", "ref.enable=true"], "a LoRA actor is its own reference"),
    (["critic.share_backbone=true", "trainer.critic_warmup=1"], "the shared value head trains only with the actor"),
    (["critic.shared_value_grad=both"], "critic.shared_value_grad='both' is unknown; use backbone"),
    (["agent.reminder=never"], "agent.reminder must be one of ('every_turn', 'first_turn'), got 'never'"),
    (["actor.lora_rank=8", "actor.use_kl_loss=true"], None),  # the reference is the actor with adapters off
    (["algorithm.rollout_correction.mode=tis"], "algorithm.rollout_correction.mode='tis' is unknown; use one of none"),
    (["algorithm.rollout_correction.mode=token_tis", "algorithm.rollout_correction.clip=0.5"],
     "algorithm.rollout_correction.clip=0.5 must be >= 1"),
    (["algorithm.rollout_correction.mode=seq_mask", "algorithm.rollout_correction.low=1.2"],
     "algorithm.rollout_correction.low=1.2 / algorithm.rollout_correction.high=2.0 must satisfy 0 <= low < 1 < high"),
    (["algorithm.rollout_correction.mode=seq_tis", "algorithm.rollout_correction.seq_agg=mean"],
     "algorithm.rollout_correction.seq_agg='mean' is unknown"),
    (["algorithm.rollout_correction.mode=seq_mask", "algorithm.rollout_correction.seq_agg=product",
      "algorithm.rollout_correction.low=0.0", "algorithm.rollout_correction.high=1.5"], None),
    (["actor.mini_batch_size=6"], "actor.mini_batch_size=6 must divide the train batch of 16 sequences"),
    (["algorithm.rollout_filter_ratio=0.5"], None),  # 2 groups x 4 = 8: divisible by 8, passes
    (["algorithm.rollout_filter_ratio=0.25"], "actor.mini_batch_size=8 must divide the train batch of 4"),
    (["algorithm.rollout_filter=top_k"], "algorithm.rollout_filter='top_k' is unknown; use one of std_ratio"),
    (["algorithm.rollout_filter=variance_share", "algorithm.rollout_filter_variance_share=0"],
     "algorithm.rollout_filter_variance_share=0.0 must be in (0, 1]"),
    (["algorithm.rollout_filter=variance_share", "rollout.group_size=1", "rollout.n_groups=8"],
     "algorithm.rollout_filter='variance_share' ranks groups by their reward variance and needs rollout.group_size >= "
     "2 (episodes that replay one seed), got 1; set rollout.group_size=2 or more"),
    (["algorithm.rollout_filter=variance_share", "algorithm.rollout_filter_ratio=0.5"],
     "algorithm.rollout_filter_ratio=0.5 has no effect: algorithm.rollout_filter='variance_share' does not read it"),
    (["algorithm.rollout_filter_variance_share=0.5"],
     "algorithm.rollout_filter_variance_share=0.5 has no effect: algorithm.rollout_filter='std_ratio' does not read"),
    (["algorithm.rollout_filter=variance_share", "algorithm.rollout_filter_variance_share=0.5"], None),  # rows vary
    (["trainer.collapse_every=0", "trainer.collapse_prompts=4"],
     "trainer.collapse_prompts=4 has no effect: trainer.collapse_every=0 (no collapse metrics)"),
    (["actor.micro_batch_size=3"], "actor.micro_batch_size=3 (per rank) must divide the per-rank mini-batch 8/1=8"),
    (["critic.mini_batch_size=5"], "critic.mini_batch_size=5 must divide the train batch of 16"),
    (["trainer.actor_world_size=3"], "actor.mini_batch_size=8 must be a multiple of the actor world size 3"),
    (["trainer.ref_world_size=3", "ref.enable=true"], "must be a multiple of trainer.ref_world_size=3"),
    (["trainer.actor_world_size=2", "trainer.use_ray=false"], "trainer.actor_world_size=2 needs Ray"),
    (["agent.max_new_tokens=2048"], "agent.max_new_tokens=2048 leaves no room for the prompt"),
    (["env=frozen_lake", "agent.max_new_tokens=512"], "prompt budget: env.max_turn * agent.max_new_tokens = 2560"),
    (["env=frozen_lake", "agent.max_context_window=2"], "agent.max_context_window=2 < env.max_turn=5 cuts history"),
    (["env=frozen_lake", "agent.max_context_window=2", "agent.layout=turn"], None),
    (["actor.temperature=0.5"], "actor.temperature=0.5 differs from agent.temperature=1.0"),
    (["agent.top_p=0.9"], "agent.top_p=0.9 / agent.top_k=0 truncate sampling"),
    (["agent.layout=turn", "actor.mini_batch_size=6"], None),  # turn rows vary: the trainer pads them
    (["trainer.total_steps=0"], "trainer.total_steps=0 must be >= 1"),
    (["actor.lr=0"], "actor.lr=0.0 trains nothing: every actor update would leave its weights as they are"),
    (["critic.lr=0"], "critic.lr=0.0 trains nothing"),
    (["actor.lr=0", "trainer.val_only=true"], None),
    (["trainer.device=tpu"], "trainer.device='tpu' is unknown"),
    (["rollout.engine=sglang"], "rollout.engine='sglang' is unknown"),
    # on CPU: fine where the CPU build of vLLM is installed (scripts/setup_vllm_env.sh), else the hint to build it
    (["rollout.engine=vllm"], None if importlib.util.find_spec("vllm") else "needs the CPU build of vLLM"),
    (["rollout.engine=vllm", "agent.temperature=2.5", "actor.temperature=2.5"],
     "agent.temperature=2.5 > 2.0: vLLM refuses hotter sampling"),
    (["rollout.engine=vllm", "rollout.val_temperature=3"], "rollout.val_temperature=3.0 > 2.0"),
    (["rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0"],
     "rollout.vllm.gpu_memory_utilization=0.0 must be in (0, 1]"),
    (["rollout.engine=vllm", "rollout.vllm.max_num_seqs=0"], "rollout.vllm.max_num_seqs=0 must be >= 1"),
    (["rollout.engine=vllm", "rollout.vllm.placement=remote"], "rollout.vllm.placement='remote' is unknown"),
    (["rollout.engine=vllm", "rollout.vllm.rollout_gpus=1"], "only applies to rollout.vllm.placement=separate"),
    (["rollout.engine=vllm", "rollout.vllm.placement=separate", "rollout.vllm.rollout_gpus=1"],
     "rollout.vllm.placement=separate needs GPUs"),
    (["trainer.device=cuda", "trainer.n_gpus_per_node=2", "rollout.engine=vllm", "rollout.vllm.placement=separate",
      "rollout.vllm.rollout_gpus=2"], "rollout.vllm.rollout_gpus=2 leaves no GPU for training out of 2"),
    (["trainer.device=cuda", "trainer.n_gpus_per_node=4", "rollout.engine=vllm", "rollout.vllm.placement=separate",
      "rollout.vllm.rollout_gpus=3", "rollout.vllm.tensor_parallel_size=2"],
     "rollout.vllm.rollout_gpus=3 must be a positive multiple of rollout.vllm.tensor_parallel_size=2"),
    (["trainer.device=cuda", "trainer.n_gpus_per_node=8", "rollout.engine=vllm", "rollout.vllm.placement=separate",
      "rollout.vllm.rollout_gpus=1", "trainer.actor_world_size=8"],
     "trainer.actor_world_size=8 exceeds the 7 training"),
    (["trainer.device=cuda", "trainer.n_gpus_per_node=2", "rollout.engine=vllm",
      "rollout.vllm.tensor_parallel_size=4"], "rollout.vllm.tensor_parallel_size=4 exceeds trainer.n_gpus_per_node=2"),
    (["trainer.device=cuda"], "trainer.device=cuda but trainer.n_gpus_per_node * trainer.nnodes = 0"),
    (["trainer.device=cuda", "trainer.n_gpus_per_node=1", "trainer.actor_world_size=2"],
     "trainer.actor_world_size=2 exceeds the 1 training GPUs"),
    (["trainer.critic_warmup=-1"], "trainer.critic_warmup=-1 must be >= 0"),
    (["algorithm=grpo", "trainer.critic_warmup=2"], "trainer.critic_warmup=2 needs a critic"),
    (["trainer.loggers=[console,tensorboard]"], "trainer.loggers has unknown logger 'tensorboard'"),
    (["trainer.keep_last_ckpt=0"], "trainer.keep_last_ckpt=0 must be >= 1 or null"),
    (["rollout.val_n_groups=0"], "rollout.val_n_groups and rollout.val_group_size must be >= 1"),
    (["rollout.dtype=int8"], "rollout.dtype='int8' is unknown; use one of auto, bfloat16, float32, float16"),
    (["rollout.dtype=auto", "actor.mixed_precision=auto", "critic.mixed_precision=auto"], None),
    (["rollout.dtype=bfloat16", "actor.mixed_precision=bf16", "critic.mixed_precision=fp32"], None),
    (["rollout.val_temperature=-0.5"], "rollout.val_temperature=-0.5 must be >= 0 (0 = greedy)"),
    (["rollout.val_temperature=0"], None),
    (["rollout.val_temperature=null"], None),
]


# The batch shape the messages above assume (independent of the trainer=cpu defaults).
PINNED = {"rollout.n_groups": "4", "rollout.group_size": "4", "actor.mini_batch_size": "8",
          "actor.micro_batch_size": "2", "critic.mini_batch_size": "8", "critic.micro_batch_size": "2",
          "agent.max_new_tokens": "128"}


def _with_pinned(overrides: list[str]) -> list[str]:
    keys = {o.split("=", 1)[0] for o in overrides}
    return [f"{k}={v}" for k, v in PINNED.items() if k not in keys] + overrides


@pytest.mark.parametrize(("overrides", "message"), CASES, ids=[" ".join(o) for o, _ in CASES])
def test_rule_message(overrides, message):
    from ragen.trainer.config.unread_keys import command_line_keys, explicit_keys

    cfg = to_train_config(compose("base", _with_pinned(overrides)))
    with explicit_keys(command_line_keys(overrides)):  # as `ragen train` checks a command line
        if message is None:
            validate(cfg)
            return
        with pytest.raises(ConfigError) as info:
            validate(cfg)
    assert message in str(info.value), str(info.value)


def test_construction_errors_name_the_key():
    with pytest.raises(ConfigError) as info:
        to_train_config(compose("base", ["+actor.learning_rate=1e-3", "actor.lr_schedule=linear", "+foo.bar=1"]))
    text = str(info.value)
    assert "unknown key(s) ['actor.learning_rate']" in text
    assert "actor.lr_schedule='linear' is unknown" in text
    assert "unknown config section 'foo'" in text


@pytest.mark.parametrize("key", ["actor.mixed_precision", "critic.mixed_precision"])
def test_unknown_mixed_precision_names_the_key_and_choices(key):
    with pytest.raises(ConfigError) as info:
        to_train_config(compose("base", [f"{key}=fp16"]))
    assert f"{key}='fp16' is unknown; use one of ('auto', 'bf16', 'fp32')" in str(info.value)


def test_all_problems_reported_together():
    cfg = to_train_config(compose("base", _with_pinned(["env.max_turn=0", "algorithm.estimator=nope"])))
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert len(info.value.problems) == 2


def test_entry_point_exits_2_with_the_messages():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ragen.train", "env.max_turn=0", "actor.micro_batch_size=3",
                           "hydra.run.dir=/tmp/ragen_cfg_check", "trainer.loggers=[jsonl]"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "env.max_turn=0 must be >= 1" in proc.stderr
    assert "actor.micro_batch_size=3 (per rank) must divide" in proc.stderr


# Credit-assignment rules: (overrides, text the message must contain, or None = the config passes).
CREDIT_CASES = [
    # trajectory layout: responses alone fit (5 * 128 = 640 < 700), but prompt + observations do not
    (["env=frozen_lake", "agent.max_model_len=700"],
     "prompt budget: env.max_turn * agent.max_new_tokens = 640 tokens of responses + about"),
    (["env=frozen_lake", "agent.max_model_len=700", "agent.layout=turn"], None),  # turn rows are exact prompts
    (["env=frozen_lake", "agent.max_model_len=1400"], None),
    (["critic.mask_env_tokens=false"], "critic.mask_env_tokens=false trains the critic's values at prompt and env "
                                       "tokens toward a return of 0"),
    (["algorithm=grpo", "critic.mask_env_tokens=false"],  # no critic: the key would do nothing
     "critic.mask_env_tokens=false has no effect: no critic: algorithm.estimator='grpo' reads no values"),
    (["algorithm.skip_env_tokens=false", "algorithm.lam=0.95"],
     "algorithm.skip_env_tokens=false with algorithm.lam=0.95 < 1 makes algorithm.estimator='gae' read"),
    (["algorithm=weighted_gae", "algorithm.skip_env_tokens=false", "algorithm.lam=0.9"],
     "algorithm.skip_env_tokens=false with algorithm.lam=0.9 < 1 makes algorithm.estimator='weighted_gae' read"),
    (["algorithm.skip_env_tokens=false", "algorithm.lam=1.0"],  # values at env tokens telescope away
     "algorithm.skip_env_tokens=false has no effect: with algorithm.gamma=1 and algorithm.lam=1 the values at env "
     "tokens cancel out"),
    (["algorithm.skip_env_tokens=false", "algorithm.gamma=0.9"], None),  # env tokens are discounted steps
    (["algorithm.skip_env_tokens=false", "algorithm.gamma=0.9", "agent.layout=turn"],
     "algorithm.skip_env_tokens=false has no effect: agent.layout=turn computes advantages on each episode's model"),
    (["algorithm=bilevel_gae", "algorithm.skip_env_tokens=false", "algorithm.lam=0.9"],
     "algorithm.skip_env_tokens=false has no effect: algorithm.estimator='bilevel_gae' does not read it"),
]


@pytest.mark.parametrize(("overrides", "message"), CREDIT_CASES, ids=[" ".join(o) for o, _ in CREDIT_CASES])
def test_credit_rule_message(overrides, message):
    test_rule_message(overrides, message)


# Values that change nothing in their configuration (ragen.trainer.config.unread_keys, and the envs' own checks): each
# is refused, naming the key and what makes it inert; tests/liveness shows each changes no number.
INERT_CASES = [
    (["algorithm=grpo", "algorithm.lam=0.9"], "algorithm.lam=0.9 has no effect: algorithm.estimator='grpo' does not "
                                             "read it"),
    (["algorithm=grpo", "algorithm.gamma=0.99"], "algorithm.gamma=0.99 has no effect"),
    (["algorithm=reinforce_pp", "algorithm.gamma=0.99"], None),  # REINFORCE++ discounts its reward-to-go
    (["algorithm.kl_coef=0.1"], "algorithm.kl_coef=0.1 has no effect: algorithm.kl_in_reward=false"),
    (["algorithm.kl_coef=0.1", "algorithm.kl_in_reward=true"], None),
    (["algorithm.whiten=false", "algorithm.eps=0.01"], "algorithm.eps=0.01 has no effect"),
    (["algorithm.estimator=reinforce_pp"], "algorithm.whiten=true has no effect: algorithm.estimator='reinforce_pp' "
                                           "already whitens its advantages"),
    (["algorithm=ms_grpo", "env=search_qa", "algorithm.use_step_reward=false"],
     "algorithm.use_step_reward=false has no effect: algorithm.estimator='ms_grpo' reads the step and outcome rewards"),
    (["actor.kl_loss_coef=0.1"], "actor.kl_loss_coef=0.1 has no effect: actor.use_kl_loss=false"),
    (["actor.kl_kind=k1"], "actor.kl_kind='k1' has no effect: actor.use_kl_loss=false"),
    (["actor.lora_alpha=8.0"], "actor.lora_alpha=8.0 has no effect: actor.lora_rank=0"),
    (["actor.lora_rank=8", "actor.lr=1e-4"], None),  # the adapters train at actor.lr
    (["algorithm=grpo", "critic.lr=1e-3"], "critic.lr=0.001 has no effect: no critic: algorithm.estimator='grpo'"),
    (["algorithm=grpo", "critic.value_clip=0.1"], "critic.value_clip=0.1 has no effect: no critic"),
    (["algorithm=grpo", "critic.share_backbone=true"], "critic.share_backbone=true has no effect: no critic"),
    (["algorithm=grpo", "critic.mini_batch_size=16"], None),  # batch shapes: the device presets set them for all runs
    (["critic.share_backbone=true", "critic.loss_agg=seq-mean-token-sum"],
     "critic.loss_agg='seq-mean-token-sum' has no effect: critic.share_backbone=true: the value head trains in the "
     "actor's update"),
    (["critic.share_backbone=true", "critic.ppo_epochs=2"], "critic.ppo_epochs=2 has no effect: critic.share_backbone"),
    (["critic.share_backbone=true", "critic.grad_clip=5.0"], "critic.grad_clip=5.0 has no effect: critic.share_back"),
    (["critic.share_backbone=true", "critic.weight_decay=0.1"], "critic.weight_decay=0.1 has no effect"),
    (["critic.share_backbone=true", "critic.lr=1e-3", "critic.value_clip=0.1"], None),  # the head reads both
    (["actor.min_lr_ratio=0.1"], "actor.min_lr_ratio=0.1 has no effect: actor.lr_schedule=constant"),
    (["critic.total_steps=5"], "critic.total_steps=5 has no effect: critic.lr_schedule=constant"),
    (["critic.shared_loss_coef=1.0"], "critic.shared_loss_coef=1.0 has no effect: no critic shares"),
    (["critic.encoder=tiny"], "critic.encoder='tiny' has no effect: only the ArCHer family's critic reads it"),
    (["archer.tau=0.5"], "archer.tau=0.5 has no effect: algorithm.name=ppo"),
    (["model.tiny_seed=3"], "model.tiny_seed=3 has no effect: model.tiny=false"),
    (["model.tiny=true", "model.tiny_seed=3"], None),
    (["rollout.vllm.max_num_seqs=64"], "rollout.vllm.max_num_seqs=64 has no effect: rollout.engine='hf'"),
    (["algorithm.rollout_correction.clip=3.0"], "algorithm.rollout_correction.clip=3.0 has no effect: "
                                                "algorithm.rollout_correction.mode='none' does not read it"),
    (["algorithm.rollout_correction.mode=token_tis", "algorithm.rollout_correction.high=3.0"],
     "algorithm.rollout_correction.high=3.0 has no effect: algorithm.rollout_correction.mode='token_tis' does not "
     "read it (it reads clip)"),
    (["algorithm.rollout_correction.mode=token_mask", "algorithm.rollout_correction.seq_agg=product"],
     "algorithm.rollout_correction.seq_agg='product' has no effect"),
    (["algorithm.rollout_correction.mode=seq_tis", "algorithm.rollout_correction.low=0.2"],
     "algorithm.rollout_correction.low=0.2 has no effect"),
    (["algorithm.rollout_correction.mode=seq_tis", "algorithm.rollout_correction.clip=3.0",
      "algorithm.rollout_correction.seq_agg=product"], None),
    (["ref.enable=true"], "ref.enable=true has no effect: no KL term reads the reference"),
    (["algorithm=grpo", "critic.enable=true"], "critic.enable=true has no effect on training"),
    (["env=static_qa", "env.config.answer_format=boxed"], "env.config of env 'static_qa' is refused by the env: "
                                                          "ValueError: row 0: no boxed answer"),
    (["env=twenty_questions", "env.max_turn=4", "env.config.oracle_max_new_tokens=4"],
     "oracle_max_new_tokens=4 has no effect with oracle='scripted': only oracle='llm' reads it"),
    (["env=guess_my_city", "env.max_turn=4", "env.config.oracle_model=other"],
     "oracle_model='other' has no effect with oracle='scripted'"),
]


@pytest.mark.parametrize(("overrides", "message"), INERT_CASES, ids=[" ".join(o) for o, _ in INERT_CASES])
def test_inert_value_message(overrides, message):
    test_rule_message(overrides, message)


def test_prompt_budget_counts_prompt_and_observation_tokens():
    """The estimate grows with the env's texts: a longer first prompt (system prompt) alone can break the budget."""
    from ragen.trainer.config.run_shape import trajectory_token_estimate

    cfg = to_train_config(compose("base", _with_pinned(["env=frozen_lake"])))
    est = trajectory_token_estimate(cfg)
    assert est.responses == 5 * 128 and est.first_prompt > 50 and est.observations > 4 * 30
    assert est.total == est.first_prompt + est.observations + est.responses
    validate(cfg)
    long = to_train_config(compose("base", _with_pinned(["env=frozen_lake", f"agent.max_model_len={est.total + 10}",
                                                         "agent.system_prompt=" + "x" * 80])))
    with pytest.raises(ConfigError, match="prompt budget"):
        validate(long)


def test_worker_total_steps_derived_from_trainer_steps():
    """``actor.total_steps: null`` = trainer.total_steps x optimizer steps per trainer step (the cosine schedule's
    horizon); an explicit value is kept, and the frozen config itself is not touched."""
    from ragen.trainer.config.run_shape import actor_worker_config, critic_worker_config

    cfg = to_train_config(compose("base", _with_pinned(["trainer.total_steps=7", "actor.ppo_epochs=2",
                                                        "critic.mini_batch_size=4", "trainer.critic_warmup=2"])))
    # 16 sequences per step: actor 16 / 8 * 2 epochs = 4 per step over 7 - 2 warm-up steps; critic 16 / 4 * 1 = 4 x 7
    assert actor_worker_config(cfg).total_steps == 5 * 4
    assert critic_worker_config(cfg).total_steps == 7 * 4
    assert cfg.actor.total_steps is None and cfg.critic.total_steps is None
    kept = to_train_config(compose("base", _with_pinned(["actor.total_steps=11", "critic.total_steps=13"])))
    assert (actor_worker_config(kept).total_steps, critic_worker_config(kept).total_steps) == (11, 13)
    turn = to_train_config(compose("base", _with_pinned(["agent.layout=turn", "env=frozen_lake"])))
    # turn layout: at most 16 episodes x 5 turns = 80 rows -> 10 mini-batches per trainer step (an upper bound)
    assert actor_worker_config(turn).total_steps == 20 * 10


def test_unknown_vllm_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['rollout.vllm.bogus'\]; valid keys of rollout.vllm"):
        to_train_config(compose("base", ["+rollout.vllm.bogus=1"]))


def test_rollout_correction_section_is_nested_and_typed():
    cfg = to_train_config(compose("base", ["algorithm.rollout_correction.mode=token_tis",
                                           "algorithm.rollout_correction.clip=3"]))
    assert cfg.algorithm.rollout_correction.mode == "token_tis" and cfg.algorithm.rollout_correction.clip == 3.0
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['algorithm.rollout_correction.level'\]"):
        to_train_config(compose("base", ["+algorithm.rollout_correction.level=token"]))
    with pytest.raises(ConfigError, match=r"algorithm.rollout_correction.clip='x' has the wrong type: expected float"):
        to_train_config(compose("base", ["algorithm.rollout_correction.clip=x"]))


def test_vllm_section_reaches_the_frozen_config():
    cfg = to_train_config(compose("base", ["rollout.vllm.gpu_memory_utilization=0.7", "rollout.vllm.max_num_seqs=32"]))
    assert (cfg.rollout.vllm.gpu_memory_utilization, cfg.rollout.vllm.max_num_seqs) == (0.7, 32)
    assert cfg.rollout.vllm.placement == "colocated" and cfg.rollout.vllm.enable_sleep_mode is True


def _reads_penalties(name: str) -> bool:
    """Whether estimator ``name``'s advantages change with per-token penalties (the KL-in-reward path)."""
    inp = random_inputs(12, seed=1, penalties=True)
    with_pen, _ = compute_advantage(name, inp)
    without, _ = compute_advantage(name, replace(inp, token_penalties=None))
    return not torch.allclose(with_pen, without)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_kl_in_reward_is_rejected_exactly_for_estimators_that_ignore_penalties(name):
    """``algorithm.kl_in_reward`` reaches the estimators as ``token_penalties``; where an estimator's advantages
    do not change with them, the setting would only build a reference model, so validation rejects it and points
    to ``actor.use_kl_loss``. Which estimators ignore them is measured, not listed."""
    overrides = [f"algorithm={name}", "algorithm.kl_in_reward=true", "env=search_qa"]
    cfg = to_train_config(compose("base", _with_pinned(overrides)))
    if _reads_penalties(name):
        validate(cfg)
        return
    assert name in ("ms_grpo", "ms_po")
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    text = str(info.value)
    assert f"algorithm.kl_in_reward=true has no effect with algorithm.estimator='{name}'" in text, text
    assert "actor.use_kl_loss=true" in text and len(info.value.problems) == 1
    # the KL loss term is the supported way, and kl_in_reward=false is accepted
    validate(to_train_config(compose("base", _with_pinned([*overrides[:1], "env=search_qa",
                                                            "actor.use_kl_loss=true"]))))


def test_a_recipes_critic_settings_stay_valid_when_the_command_switches_to_a_critic_free_estimator():
    # ppo_bandit's recipe gives its shared value head critic.lr=5e-4; `bash train_ppo.sh algorithm=grpo` must run, and
    # a critic.lr typed on the same command line must be refused (the command line's keys: explicit_keys)
    from ragen.launch import validate
    from ragen.trainer.config.unread_keys import command_line_keys, explicit_keys

    switch = ["algorithm=grpo", "rollout.group_size=8"]
    cfg = load_train_config("ppo_bandit", switch)
    assert cfg.critic.lr == 5e-4
    with explicit_keys(command_line_keys(switch)):
        validate(cfg)
    typed = [*switch, "critic.lr=1e-4"]
    with explicit_keys(command_line_keys(typed)), pytest.raises(ConfigError, match="critic.lr=0.0001 has no effect"):
        validate(load_train_config("ppo_bandit", typed))
    validate(cfg)  # built in Python: where critic.lr came from is unknown, so it is not reported


@pytest.mark.parametrize(("override", "message"), [("trainer.collapse_every=-1", "trainer.collapse_every must be >= 0"),
                                                    ("trainer.collapse_prompts=1",
                                                     "trainer.collapse_prompts must be >= 2")])
def test_collapse_keys_refused_by_the_schema(override, message):
    with pytest.raises(ConfigError, match=message):
        to_train_config(compose("base", [override]))
