"""GPU twins of the hf engine checks (``device`` fixture: ``cpu`` every run, ``cuda`` under the ``gpu`` marker).

* KV reuse across turns (``prefix_cache``) gives the greedy rollouts of full prefills, turn after turn, in fp32.
* ``sleep`` frees the engine's CUDA memory (``torch.cuda.memory_allocated`` drops by at least the model's bytes),
  ``wake`` allocates it again, and the engine then generates what it generated before (on CPU both are no-ops for
  the weights; the KV caches of the last call are dropped on every device).

The model is a random Llama built from a config (vocab 1000; no tokenizer files needed), prompts are token ids.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ragen.rollout import SamplingParams
from ragen.rollout.hf import HFEngine

TURN1 = [[1, 200, 300, 45, 9], [7, 8], [1, 11, 12, 13, 14, 15, 16, 17, 18]]
OBS = [[50, 51, 52], [60], [70, 71, 72, 73, 74, 75, 76]]  # each episode's next observation (the same every turn)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def _lm(hidden: int = 64, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer random Llama (vocab 1000, eos id 2) in fp32 on CPU."""
    cfg = LlamaConfig(vocab_size=1000, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def test_kv_reuse_across_turns_gives_the_greedy_rollouts_of_full_prefills(device, char_tokenizer):
    cached = HFEngine(_lm(), char_tokenizer, device=device, dtype="float32", prefix_cache=True)
    plain = HFEngine(_lm(), char_tokenizer, device=device, dtype="float32")
    assert cached.model.device.type == plain.model.device.type == device
    prompts = TURN1
    for turn in range(3):
        reused = cached.generate(prompts, GREEDY)
        full = plain.generate(prompts, GREEDY)
        assert [s.token_ids for s in reused] == [s.token_ids for s in full], turn
        for a, b in zip(reused, full, strict=True):
            torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4, rtol=0)
        assert cached.prefix_store.hits == len(prompts) * turn  # every later turn extends a stored sequence
        prompts = [p + s.token_ids + o for p, s, o in zip(prompts, reused, OBS, strict=True)]
    assert cached.prefix_store.reused_tokens > 0


def test_sleep_frees_the_engine_memory_and_wake_restores_it(device, char_tokenizer):
    engine = HFEngine(_lm(hidden=256), char_tokenizer, device=device, dtype="float32", prefix_cache=True)
    weights = _weight_bytes(engine.model)
    first = engine.generate(TURN1, GREEDY)
    assert engine.prefix_store.fresh  # the call's KV caches are kept for the next turn
    allocated = torch.cuda.memory_allocated if device == "cuda" else None
    if allocated:
        torch.cuda.synchronize()
        awake = allocated()
    engine.sleep()
    assert not engine.prefix_store.entries and not engine.prefix_store.fresh  # KV caches dropped on every device
    assert {p.device.type for p in engine.model.parameters()} == {"cpu"}
    if allocated:
        asleep = allocated()
        assert awake - asleep >= weights, (awake, asleep, weights)
    engine.wake()
    assert {p.device.type for p in engine.model.parameters()} == {device}
    if allocated:
        assert allocated() - asleep >= weights, (allocated(), asleep, weights)
    again = engine.generate(TURN1, GREEDY)
    assert [s.token_ids for s in again] == [s.token_ids for s in first]
    for a, b in zip(again, first, strict=True):
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-6)
