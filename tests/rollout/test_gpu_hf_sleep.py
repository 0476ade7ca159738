"""The hf engine's sleep on a GPU (``ragen.rollout.offload.HostOffload``): one host buffer per tensor, allocated on
the first sleep and reused after, values unchanged by sleep + wake, a weight update while asleep kept; the engine
wakes its weights for ``None`` / ``("weights",)`` only. On CPU the same code runs host to host (pinning needs CUDA);
the ``cuda`` twin checks the device memory is given back and the samples are unchanged."""

from __future__ import annotations

import gc

import pytest
import torch

from ragen.models import tiny_model
from ragen.rollout import SamplingParams
from ragen.rollout.hf import HFEngine
from ragen.rollout.offload import HostOffload


def _module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10), torch.nn.BatchNorm1d(10))


def test_offload_reuses_its_host_buffers_and_restores_the_values():
    m = _module()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    off = HostOffload(m, pin=False)
    off.offload()
    buffers = {k: v.data_ptr() for k, v in off.host.items()}
    assert set(buffers) == {n for n, _ in [*m.named_parameters(), *m.named_buffers()]}
    assert all(t.data_ptr() == off.host[n].data_ptr() for n, t in [*m.named_parameters(), *m.named_buffers()])
    off.offload()  # asleep already: nothing moves
    off.restore()
    assert all(t.data_ptr() != off.host[n].data_ptr() for n, t in m.named_parameters())  # fresh memory on wake
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    with torch.no_grad():
        m[1].weight.add_(1.0)
    off.offload()
    assert {k: v.data_ptr() for k, v in off.host.items()} == buffers  # the same buffers, allocated once
    with torch.no_grad():
        m[1].bias.mul_(2.0)  # an update while asleep lands in the host buffer
    off.restore()
    assert torch.equal(m[1].weight, before["1.weight"] + 1.0)
    assert torch.equal(m[1].bias, before["1.bias"] * 2.0)


def test_tied_weights_are_moved_once_and_stay_tied(default_tokenizer):
    model = tiny_model(tokenizer=default_tokenizer, seed=0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    off = HostOffload(model, pin=False)
    off.offload()
    assert "lm_head.weight" not in off.host
    off.restore()
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_hf_engine_wakes_its_weights_for_the_weights_tag_only(tokenizer_dir, device):
    from ragen.models import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)  # the GPU machine has the tokenizer folder, not the packaged model
    engine = HFEngine(tiny_model(tokenizer=tokenizer, seed=0), tokenizer, device=device)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=5)
    prompts = [[1, 2000, 300, 45], [7, 8]]
    want = engine.generate(prompts, sampling)
    if device == "cpu":  # nothing to free on CPU: sleep and wake leave the weights where they are
        ptr = engine.model.lm_head.weight.data_ptr()
        engine.sleep()
        engine.wake(None)
        assert engine.model.lm_head.weight.data_ptr() == ptr
        return
    # the drop, not the level: earlier tests of the same process may still hold device memory of their own
    weights = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                  [*engine.model.parameters(), *engine.model.buffers()]}.values())
    gc.collect()
    allocated = torch.cuda.memory_allocated()
    engine.sleep()
    assert allocated - torch.cuda.memory_allocated() >= 0.99 * weights
    assert all(t.device.type == "cpu" for t in [*engine.model.parameters(), *engine.model.buffers()])
    assert all(b.is_pinned() for b in engine._offload.host.values())
    engine.wake(("kv_cache",))  # the KV cache is built per call: the weights stay on the host
    assert engine.model.lm_head.weight.device.type == "cpu"
    engine.wake(("weights",))
    assert engine.model.lm_head.weight.device.type == "cuda"
    got = engine.generate(prompts, sampling)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert [lp for s in got for lp in s.log_probs] == pytest.approx([lp for s in want for lp in s.log_probs])
