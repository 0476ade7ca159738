"""GPU twins of the offload and phase-memory checks (``device`` fixture: ``cpu`` every run, ``cuda`` under the
``gpu`` marker).

* An actor beside an hf engine on one device: after an update, ``offload`` frees the parameters' and AdamW state's
  device memory (``torch.cuda.memory_allocated`` drops by at least their bytes, the released cache lowers
  ``memory_reserved``, the host buffers are pinned), the engine wakes and generates with none of it back, and
  ``reload`` returns the memory and the state bitwise. On CPU the same moves run with ``host_copies`` (the storages
  empty and refill); the engine's sleep / wake are no-ops there.
* ``PhaseMemory`` reports ``allocated`` / ``reserved`` peaks in a process that uses CUDA, the RSS elsewhere.

The model: a 2-layer random Llama (hidden 256, vocab 4096: about 2.2M parameters, 26 MB of weights and AdamW state,
so the drops are far above the allocator's rounding).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from worker_helpers import placed_on, random_batch

from ragen.rollout import SamplingParams
from ragen.rollout.hf import HFEngine
from ragen.utils.memory import PhaseMemory
from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch

MIB = 1024 * 1024
GB = 1024**3
CFG = ActorConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=4, mixed_precision="fp32")


def _lm() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return LlamaForCausalLM(cfg)


@pytest.fixture
def model_dir(tmp_path, tokenizer_dir, no_packaged_model) -> str:
    """The model saved with the default tokenizer from ``tokenizer_dir`` (the GPU machine has no packaged model)."""
    from transformers import AutoTokenizer

    path = tmp_path / "lm"
    _lm().save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return str(path)


def _on_device(worker) -> list[torch.Tensor]:
    """The worker's parameters and optimizer-state tensors held on its device (AdamW's step counts stay on the host
    on CUDA)."""
    tensors = [p.detach() for p in worker.module.parameters()]
    tensors += [v for s in worker.trainable.optimizer.state.values() for v in s.values()]
    return [t for t in tensors if t.device.type == worker.device.type]


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def test_offload_frees_the_training_state_while_the_engine_generates(device, model_dir, char_tokenizer):
    with placed_on(device):
        group = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=CFG)
    worker, offloader = group.worker, group.worker.state_offload()
    assert offloader.host_copies == (device == "cuda")
    offloader.host_copies = True  # CPU: the storage moves a GPU makes
    engine = HFEngine(_lm(), char_tokenizer, device=device, dtype="float32")
    ids, attn, resp = random_batch(B=8, T=24, seed=3)
    batch = TrainBatch(ids, attn, resp, advantages=torch.randn(8, 24, generator=torch.Generator().manual_seed(4)))
    group.call("update", batch.with_fields(old_log_probs=group.call("compute_log_probs", batch)))
    state = _on_device(worker)
    held, before = _bytes(state), [t.clone() for t in state]
    assert held > 20 * MIB
    cuda = device == "cuda"
    allocated = torch.cuda.memory_allocated if cuda else lambda: _bytes(_on_device(worker))
    engine.sleep()
    start, reserved = allocated(), torch.cuda.memory_reserved() if cuda else 0
    group.call("offload")
    off = allocated()
    assert start - off >= held, (start, off, held)
    if cuda:
        assert torch.cuda.memory_reserved() < reserved  # the freed blocks went back to the driver
        assert all(b.is_pinned() for b in offloader._host.values())
    engine.wake()
    if cuda:
        weights = sum(t.numel() * t.element_size() for t in [*engine.model.parameters(), *engine.model.buffers()])
        assert weights <= allocated() - off < weights + MIB  # the engine's weights and nothing of the actor
    out = engine.generate([[1, 200, 300, 45], [7, 8]], SamplingParams(temperature=0.0, max_new_tokens=4))
    assert all(len(s.token_ids) == 4 for s in out)
    engine.sleep()
    group.call("reload")
    assert allocated() - off >= held
    assert all(torch.equal(a, b) for a, b in zip(_on_device(worker), before, strict=True))


def test_phase_memory_reads_the_peaks_of_the_memory_the_process_uses(device):
    phases = PhaseMemory()
    with phases.measure("p"):
        block = torch.ones(64 * MIB // 4, device=device)
        del block
    got = phases.take()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # the process uses CUDA (an earlier cuda twin too)
        assert set(got) == {"memory/p/allocated", "memory/p/reserved"}
        assert got["memory/p/reserved"] >= got["memory/p/allocated"]
        if device == "cuda":
            assert got["memory/p/allocated"] >= 64 * MIB / GB
    else:
        assert 0.01 < got["memory/p/rss"] < 64 and set(got) <= {"memory/p/rss", "memory/p/rss_peak"}
