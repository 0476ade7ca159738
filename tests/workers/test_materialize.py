"""Meta-device builds of the workers (``ragen.workers.materialize``) against plain loads of the same folder, in one
process: the unsharded path and the FSDP2 path (a one-rank gloo group) give the plain model's weights bit for bit,
its RoPE buffers (recomputed by the model's own init), one tied embedding, the plain config; LoRA's initial adapters
are those of ``add_lora`` on the plain model; names map with or without the base model's prefix; checkpoints that do
not fit fail naming the weight."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from worker_helpers import make_lm, sharded_world_of_one

from ragen.models.meta import empty_from_config, restore_non_persistent_buffers
from ragen.models.weights import MemoryReader
from ragen.workers import ActorConfig, CriticConfig, CriticWorker, PolicyWorker
from ragen.workers import materialize as M
from ragen.workers.lora import add_lora, initial_adapters

CFG = ActorConfig(mixed_precision="fp32", mini_batch_size=2, micro_batch_size=2)


def _plain(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _full(worker) -> dict[str, torch.Tensor]:
    from ragen.workers import dist as D

    return D.full_state_dict(worker.module)


def _check_policy(worker, plain) -> None:
    lm = worker.module.lm
    state = _full(worker)
    assert state.keys() == {f"lm.{k}" for k in plain.state_dict()}
    assert all(torch.equal(state[f"lm.{k}"], v) for k, v in plain.state_dict().items())
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # still one tied parameter
    buffers = dict(lm.named_buffers())
    assert {k: v.dtype for k, v in buffers.items()} == {k: v.dtype for k, v in plain.named_buffers()}
    assert all(torch.equal(buffers[k], v) for k, v in plain.named_buffers())  # inv_freq from the model's init
    assert lm.config.to_dict() == plain.config.to_dict()
    assert lm.generation_config.to_dict() == plain.generation_config.to_dict()


@pytest.mark.parametrize("sharded", [False, True])
def test_policy_build_equals_the_plain_load(model_dir, sharded):
    if not sharded:
        _check_policy(PolicyWorker(model_dir, CFG), _plain(model_dir))
        return
    with sharded_world_of_one("cpu"):
        worker = PolicyWorker(model_dir, CFG)
        assert all(hasattr(p, "full_tensor") for p in worker.module.parameters())  # FSDP2 DTensors
        _check_policy(worker, _plain(model_dir))


def test_critic_build_equals_its_plain_value_model(model_dir, tmp_path):
    from transformers import AutoModel

    from ragen.models.value_head import ValueModel

    critic = CriticWorker(model_dir, CriticConfig(mixed_precision="fp32", mini_batch_size=2, micro_batch_size=2))
    plain = ValueModel.from_causal_lm(_plain(model_dir))
    state = _full(critic)
    assert state.keys() == plain.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in plain.state_dict().items())  # the head: zeros
    torch.manual_seed(1)
    ValueModel(AutoModel.from_pretrained(model_dir), head_init_std=0.3).save(tmp_path / "c")
    saved = CriticWorker(str(tmp_path / "c"), CriticConfig(mixed_precision="fp32", mini_batch_size=2,
                                                           micro_batch_size=2))
    expected = ValueModel.load(tmp_path / "c").state_dict()
    assert all(torch.equal(_full(saved)[k], v) for k, v in expected.items())
    assert float(expected["head.weight"].abs().max()) > 0


@pytest.mark.parametrize("seed", [0, 7])
def test_initial_adapters_equal_add_lora_on_the_plain_model(seed):
    plain = add_lora(make_lm(seed=2), 4, 8.0, seed=seed)
    meta = empty_from_config(make_lm().config)
    adapters = initial_adapters(meta, 4, 8.0, seed=seed)
    expected = {k: v for k, v in plain.state_dict().items() if "lora_" in k}
    assert adapters.keys() == expected.keys() and len(expected) == 28
    assert all(torch.equal(adapters[k], v) for k, v in expected.items())
    assert all(p.is_meta for p in meta.parameters())  # the model itself stays weightless


def test_ref_holds_bf16_weights_where_it_computes_in_bf16(model_dir):
    bf16 = CFG.__class__(**{**CFG.__dict__, "mixed_precision": "bf16"})
    ref = PolicyWorker(model_dir, bf16, role="ref")
    plain = _plain(model_dir)
    state = _full(ref)
    assert all(state[f"lm.{k}"].dtype == torch.bfloat16 and torch.equal(state[f"lm.{k}"], v.to(torch.bfloat16))
               for k, v in plain.state_dict().items())
    assert ref.module.lm.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE stays fp32, as from_pretrained
    actor = PolicyWorker(model_dir, bf16)
    assert {p.dtype for p in actor.module.parameters()} == {torch.float32}  # the actor keeps fp32 masters


def test_names_match_with_or_without_the_base_prefix_and_lora_renames():
    module = ["lm.model.layers.0.q.base_layer.weight", "lm.lm_head.weight", "lm.model.norm.weight", "other.x"]
    causal = ["model.layers.0.q.weight", "lm_head.weight", "model.norm.weight"]
    base = ["layers.0.q.weight", "norm.weight"]
    rename = lambda n: n.replace(".base_layer.", ".")  # noqa: E731
    kw = {"prefix": "lm.", "base_prefix": "model.", "rename": rename}
    assert M.checkpoint_names(module, causal, **kw) == {"lm.model.layers.0.q.base_layer.weight":
                                                        "model.layers.0.q.weight", "lm.lm_head.weight":
                                                        "lm_head.weight", "lm.model.norm.weight": "model.norm.weight"}
    assert M.checkpoint_names(module, base, **kw) == {"lm.model.layers.0.q.base_layer.weight": "layers.0.q.weight",
                                                      "lm.model.norm.weight": "norm.weight"}
    backbone = M.checkpoint_names(["backbone.norm.weight"], causal, prefix="backbone.", base_prefix="model.")
    assert backbone == {"backbone.norm.weight": "model.norm.weight"}


def test_checkpoints_that_do_not_fit_fail_naming_the_weight():
    lm = empty_from_config(make_lm().config)
    lm.to_empty(device="cpu")
    wider = make_lm(vocab=1200).state_dict()
    plan = M.reader_sources(MemoryReader(wider), {k: k for k in wider})
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight: the checkpoint holds shape \(1200, 32\)"):
        M.load_weights(lm, plan)
    partial = {k: v for k, v in make_lm().state_dict().items() if "layers.1." not in k}
    plan = M.reader_sources(MemoryReader(partial), {k: k for k in partial})
    with pytest.raises(ValueError, match=r"lacks 9 weight\(s\) of the model, e.g. \['model.layers.1"):
        M.load_weights(lm, plan)
    assert M.load_weights(lm, plan, optional=lambda n: "layers.1." in n)[0].startswith("model.layers.1.")


def test_restored_buffers_are_the_models_own():
    plain = make_lm()
    lm = empty_from_config(plain.config)
    lm.to_empty(device="cpu")
    with torch.no_grad():
        lm.model.rotary_emb.inv_freq.fill_(123.0)
    assert restore_non_persistent_buffers(lm) == ["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"]
    assert torch.equal(lm.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq)


def test_every_tensor_rank_loads_by_blocks_of_rows(monkeypatch):
    """0-d buffers, empty tensors and tensors larger than one read block (copied block by block) all load."""
    from torch import nn

    monkeypatch.setattr(M, "BLOCK_BYTES", 3 * 4 * 4)  # 3 rows of 4 fp32 per block: a 10-row tensor takes 4 reads
    module = nn.Module()
    module.register_buffer("scale", torch.tensor(0.0))
    module.big = nn.Parameter(torch.zeros(10, 4))
    module.none = nn.Parameter(torch.zeros(0, 4))
    state = {"scale": torch.tensor(2.5), "big": torch.arange(40.0).reshape(10, 4).double(), "none": torch.zeros(0, 4)}
    reads = []
    plan = {k: M.Source(s.shape, lambda i, s=s: reads.append(i) or s.read(i)) for k, s in
            M.reader_sources(MemoryReader(state), {k: k for k in state}).items()}
    assert M.load_weights(module, plan) == []
    assert module.scale == 2.5 and torch.equal(module.big, state["big"].float()) and module.big.dtype == torch.float32
    assert [i[0] for i in reads if len(i) == 2 and i[0].stop > 0] == [slice(0, 3), slice(3, 6), slice(6, 9),
                                                                      slice(9, 10)]
