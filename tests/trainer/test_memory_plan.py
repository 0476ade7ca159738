"""The memory plan (``ragen.trainer.config.memory_plan``, pure) against hand-computed bytes, and its inputs from a
config (``ragen.trainer.config.memory_checks``). The command-line path is tests/cli/test_memory_check.py."""

from __future__ import annotations

import pytest

from ragen.models.shape import ModelShape
from ragen.trainer.config.memory_plan import (
    ACTOR_UPDATE,
    CRITIC_UPDATE,
    LOGPROBS,
    ROLLOUT,
    EngineLoad,
    MemoryInputs,
    RoleLoad,
    plan_lines,
    plan_memory,
)

GIB = 2**30
# hidden 1024, MLP 2816, 8 layers, 16 heads of 64, 4 key/value heads, vocab 32000, untied head
SHAPE = ModelShape(hidden=1024, intermediate=2816, layers=8, heads=16, kv_heads=4, head_dim=64, vocab=32000,
                   tied=False)
LAYER = 1024 * 1024 + 2 * 1024 * 256 + 1024 * 1024 + 3 * 1024 * 2816 + 2 * 1024  # 11,274,240
ROOT = 2 * 32000 * 1024 + 1024  # embedding, head, final norm
P = ROOT + 8 * LAYER  # 155,730,944


def _term(plan, name):
    return next(t for t in plan.terms if t.name == name)


def test_shape_of_the_hand_examples():
    assert (SHAPE.layer_params, SHAPE.root_params, SHAPE.params) == (LAYER, ROOT, P) == (11_274_240, 65_537_024,
                                                                                         155_730_944)


def test_sharded_bf16_actor_with_reference_and_sleeping_vllm_by_hand():
    """4 ranks, bf16, no checkpointing, micro-batches of 2 rows x 2048 tokens, log-prob chunks of 512, a reference,
    vLLM at 0.4 of a 24 GiB GPU with sleep mode."""
    inp = MemoryInputs(shape=SHAPE, gpu_gib=24.0, seq_len=2048, chunk=512,
                       actor=RoleLoad(P, P, world=4, micro_rows=2, infer_rows=4, checkpointing=False, compute_bytes=2),
                       ref_world=4, engine=EngineLoad("vllm", utilization=0.4, sleeps=True, weight_bytes=2))
    plan = plan_memory(inp)
    expect = {
        "actor weights": 4 * P / 4, "actor AdamW moments": 8 * P / 4, "actor gradients": 4 * P / 4,
        "actor gathered weights": (ROOT + 2 * LAYER) * 2 * 2,  # bf16 weights and gradients, root + 2 layers
        "actor activations": 2 * 2048 * 8 * 1.3 * (13 * 1024 + 4 * 2816) * 2,
        "actor logits": 512 * 32000 * 24,  # one chunk, recomputed in backward
        "reference weights": 2 * P / 4,  # no optimizer: bf16, its compute precision
        "largest no-grad pass": 4 * 2048 * ((4 * 1024 + 3 * 2816) * 2 + 4 * 1024) + (ROOT + 2 * LAYER) * 2
        + 512 * 32000 * 18,
        "CUDA contexts": 2 * 0.5 * GIB, "vllm engine": 0.4 * 24 * GIB, "vllm engine asleep": 1.0 * GIB,
    }
    assert [t.name for t in plan.terms] == list(expect)
    for name, value in expect.items():
        assert _term(plan, name).gib == pytest.approx(value / GIB, rel=1e-12), name
    g = {k: v / GIB for k, v in expect.items()}
    resident = g["actor weights"] + g["actor AdamW moments"] + g["reference weights"] + g["CUDA contexts"]
    assert plan.phases == pytest.approx({
        ROLLOUT: resident + 9.6,
        LOGPROBS: resident + g["largest no-grad pass"] + 1.0,
        ACTOR_UPDATE: resident + g["actor gradients"] + g["actor gathered weights"] + g["actor activations"]
        + g["actor logits"] + 1.0})
    assert plan.peak_phase == ROLLOUT and plan.fits and plan.peak == pytest.approx(resident + 9.6)  # 11.2 GiB
    assert "sleep mode" in _term(plan, "vllm engine asleep").what
    # vLLM's own budget: 9.6 GiB - weights 2 B x P - 2 GiB working, over 2 x 8 layers x 4 heads x 64 x 2 B per token
    tokens = int((9.6 - 2 * P / GIB - 2.0) * GIB // (2 * 8 * 4 * 64 * 2))
    assert f"= {tokens} tokens ({tokens // 2048} sequences of 2048)" in plan.engine_note
    lines = plan_lines(plan, "GPU 0")
    assert lines[-1].endswith(f"peak {plan.peak:.2f} GiB (rollout) = {100 * plan.peak / 24:.0f}% of 24 GiB: fits")


def test_one_rank_lora_checkpointing_critic_and_hf_engine_by_hand():
    """World size 1 (autocast: a bf16 copy of the weights, fp32 residual stream), LoRA rank 8 on every linear,
    gradient checkpointing, a critic of its own, the hf engine keeping 16 sequences' KV caches on GPU 0."""
    adapters = SHAPE.lora_params(8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    assert adapters == 8 * 8 * ((1024 + 1024) + 2 * (1024 + 256) + (1024 + 1024) + 2 * (1024 + 2816) + (2816 + 1024))
    critic_params = P - 32000 * 1024 + 1024 + 1  # no output head; Linear(hidden, 1)
    inp = MemoryInputs(
        shape=SHAPE, gpu_gib=12.0, seq_len=2048, chunk=1024,
        actor=RoleLoad(P + adapters, adapters, world=1, micro_rows=1, infer_rows=2, checkpointing=True,
                       compute_bytes=2),
        critic=RoleLoad(critic_params, critic_params, world=1, micro_rows=1, infer_rows=2, checkpointing=False,
                        compute_bytes=2, logits=False),
        engine=EngineLoad("hf", weight_bytes=2, kv_sequences=16))
    plan = plan_memory(inp)
    layer_act = 1.3 * ((13 * 1024 + 4 * 2816) * 2 + 4 * 1024)  # fp32 residual adds 4 hidden bytes
    expect = {
        "actor AdamW moments": 8 * adapters, "actor gradients": 4 * adapters,
        "actor gathered weights": P * 2,  # autocast's bf16 copy
        "actor activations": 2048 * (8 * 6 * 1024 * 4 + layer_act),  # 6 x the fp32 layer input + one layer
        "critic weights": 4 * critic_params, "critic gathered weights": (P - 32000 * 1024) * 2,
        "critic activations": 2048 * 8 * layer_act,
        "engine": P * 2 + 16 * 2048 * (2 * 8 * 4 * 64 * 2),
        "engine process": 0.5 * GIB,
    }
    for name, value in expect.items():
        assert _term(plan, name).gib == pytest.approx(value / GIB, rel=1e-12), name
    assert "logits" not in " ".join(t.name for t in plan.terms if t.name.startswith("critic"))
    assert set(plan.phases) == {ROLLOUT, LOGPROBS, ACTOR_UPDATE, CRITIC_UPDATE}
    assert _term(plan, "engine").phases == (ROLLOUT, LOGPROBS, ACTOR_UPDATE, CRITIC_UPDATE)  # never asleep
    critic = sum(_term(plan, f"critic {n}").gib for n in ("gradients", "gathered weights", "activations"))
    assert plan.phases[CRITIC_UPDATE] - plan.phases[ROLLOUT] == pytest.approx(critic)


def test_offload_keeps_only_the_running_role_on_the_gpu():
    """``offload``: the roles' weights and AdamW state leave the GPU outside their passes, so the rollout phase
    holds the engine and the CUDA contexts only."""
    base = MemoryInputs(shape=SHAPE, gpu_gib=24.0, seq_len=1024, chunk=512,
                        actor=RoleLoad(P, P, 2, 1, 1, True, 2), ref_world=2, engine=EngineLoad("vllm", utilization=0.5))
    on, off = plan_memory(base), plan_memory(MemoryInputs(**{**base.__dict__, "offload": True}))
    assert off.phases[ROLLOUT] == pytest.approx(12.0 + 2 * 0.5)
    assert on.phases[ROLLOUT] == pytest.approx(12.0 + 1.0 + (4 * P / 2 + 8 * P / 2 + 2 * P / 2) / GIB)
    assert _term(off, "actor AdamW moments").phases == (ACTOR_UPDATE,)
    assert off.phases[ACTOR_UPDATE] == pytest.approx(on.phases[ACTOR_UPDATE] - 2 * P / 2 / GIB)  # no reference


def test_vllm_share_without_room_for_one_sequence_is_a_problem_and_separate_gpus_leave_gpu0():
    big = ModelShape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256,
                     tied=False)
    actor = RoleLoad(big.params, big.params, 8, 1, 1, True, 2)
    small = plan_memory(MemoryInputs(shape=big, gpu_gib=16.0, seq_len=4096, chunk=1024, actor=actor,
                                     engine=EngineLoad("vllm", utilization=0.5, tensor_parallel=1)))
    assert not small.fits and "leaves KV cache for 0 tokens" in small.problems[0]
    assert "rollout.vllm.tensor_parallel_size=1" in small.problems[0]
    split = plan_memory(MemoryInputs(shape=big, gpu_gib=16.0, seq_len=4096, chunk=1024, actor=actor,
                                     engine=EngineLoad("vllm", utilization=0.9, tensor_parallel=2)))
    assert not split.problems  # 14.4 GiB share, 7.5 GiB of weights per GPU
    separate = plan_memory(MemoryInputs(shape=big, gpu_gib=80.0, seq_len=4096, chunk=1024, actor=actor,
                                        engine=EngineLoad("vllm", colocated=False, utilization=0.9)))
    assert not any("vllm" in t.name for t in separate.terms) and "(its own GPUs)" in separate.engine_note


def test_inputs_from_the_gpu_recipes():
    """Rows per micro-batch and pass on one rank from the config: search_qa's recipe, 336 rows over 8 ranks in
    micro-batches of 6; RAGEN's PPO recipe, mini-batches of 32 over 8 ranks = 4 rows, 8 x 16 = 128 episodes of which
    the rollout filter keeps 2 groups = 32 rows, 4 per rank."""
    from ragen.trainer.config.compose import load_train_config
    from ragen.trainer.config.memory_checks import memory_inputs

    gpu8 = ["trainer=gpu", "trainer.n_gpus_per_node=8"]
    qa = memory_inputs(load_train_config("search_qa_ms_grpo", gpu8), SHAPE, 80.0)
    assert (qa.actor.micro_rows, qa.actor.infer_rows, qa.actor.world, qa.seq_len, qa.critic, qa.ref_world) == (
        6, 6, 8, 4096, None, None)
    assert (qa.engine.kind, qa.engine.utilization, qa.engine.sleeps, qa.engine.colocated) == ("vllm", 0.5, True, True)
    ppo = memory_inputs(load_train_config("ppo_bandit", gpu8), SHAPE, 80.0)
    assert (ppo.actor.micro_rows, ppo.actor.infer_rows, ppo.critic.micro_rows, ppo.seq_len) == (4, 4, 4, 3600)
    assert ppo.critic.params == P - 32000 * 1024 + 1024 + 1 and not ppo.critic.logits
    lora = memory_inputs(load_train_config("ppo_bandit", [*gpu8, "actor.lora_rank=4"]), SHAPE, 80.0)
    assert lora.actor.trained == SHAPE.lora_params(4, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                       "up_proj", "down_proj"))
    hf = memory_inputs(load_train_config("ppo_multi_turn", [*gpu8, "rollout.engine=hf"]), SHAPE, 80.0)
    assert (hf.engine.kind, hf.engine.kv_sequences) == ("hf", 256)  # multi-turn: every validation episode's cache


def test_gpu_size_is_set_detected_or_assumed_and_said(monkeypatch):
    from ragen.trainer.config import memory_checks
    from ragen.trainer.config.compose import load_train_config

    cfg = load_train_config("ppo_bandit", ["trainer=gpu"])
    monkeypatch.setattr(memory_checks, "detected_gpu", lambda: None)
    gib, source = memory_checks.gpu_size(cfg)
    assert gib == 80.0 and source.startswith("ASSUMED: no GPU is visible here; set trainer.gpu_memory_gb")
    monkeypatch.setattr(memory_checks, "detected_gpu", lambda: (139.8, "NVIDIA H200"))
    assert memory_checks.gpu_size(cfg) == (139.8, "detected: NVIDIA H200")
    cfg = load_train_config("ppo_bandit", ["trainer=gpu", "trainer.gpu_memory_gb=40"])
    assert memory_checks.gpu_size(cfg) == (40.0, "trainer.gpu_memory_gb=40")


@pytest.mark.parametrize("override,message", [
    ("trainer.gpu_memory_gb=0", "trainer.gpu_memory_gb must be > 0"),
    ("trainer.memory_check=maybe", "trainer.memory_check='maybe' is unknown; use refuse"),
])
def test_bad_memory_keys_name_the_key(override, message):
    from ragen.trainer.config.compose import load_train_config
    from ragen.trainer.config.schema import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_train_config("ppo_bandit", [override])


def test_refusal_names_the_knobs_of_its_peak_phase_first():
    """Without checkpointing the update peaks: checkpointing and the micro-batch come first, the engine's share
    last; each named with its current value."""
    from ragen.trainer.config.compose import load_train_config
    from ragen.trainer.config.memory_checks import knobs, memory_inputs

    cfg = load_train_config("ppo_bandit", ["trainer=gpu", "actor.gradient_checkpointing=false",
                                           "critic.gradient_checkpointing=false"])
    plan = plan_memory(memory_inputs(cfg, SHAPE, 4.0))
    assert plan.peak_phase in (ACTOR_UPDATE, CRITIC_UPDATE)
    named = knobs(cfg, plan)
    assert named[0].startswith("actor.gradient_checkpointing=true / critic.gradient_checkpointing=true")
    assert named[1].startswith("a smaller actor.micro_batch_size (now 4) / critic.micro_batch_size (now 4)")
    assert named[-1].startswith("a lower rollout.vllm.gpu_memory_utilization (now 0.5)")
    assert any(k.startswith("actor.lora_rank=16") for k in named)
