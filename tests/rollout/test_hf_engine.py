"""HFEngine: exact log-probs, stops, lengths, determinism, weight updates (tiny model + one default-model check)."""

import math

import pytest
import torch

from ragen.models import tiny_model
from ragen.rollout import SamplingParams
from ragen.rollout.hf import MIN_SHARED_PREFIX, HFEngine, _shared_prefix_len, sampling_log_probs

PROMPTS = [[1, 2000, 300, 45, 9], [7], [1, 11, 12, 13, 14, 15, 16, 17, 18], [400, 401]]


@pytest.fixture
def engine(default_tokenizer):
    return HFEngine(tiny_model(tokenizer=default_tokenizer, seed=0), default_tokenizer, batch_size=3)


def teacher_forced(model, prompt, ids, sampling):
    """Log-probs of ``ids`` after ``prompt`` from one unpadded forward pass under the sampling distribution."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    logp = sampling_log_probs(logits, sampling.temperature, sampling.top_p, sampling.top_k)
    return logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1.0, max_new_tokens=10, seed=3),
        SamplingParams(temperature=0.6, top_p=0.8, top_k=40, max_new_tokens=10, seed=3),
        SamplingParams(temperature=0.0, max_new_tokens=10),
    ],
)
def test_log_probs_match_teacher_forced_forward(engine, sampling):
    samples = engine.generate(PROMPTS, sampling)
    assert len(samples) == len(PROMPTS)
    for prompt, sample in zip(PROMPTS, samples, strict=True):
        assert len(sample.token_ids) == len(sample.log_probs) == 10
        ref = teacher_forced(engine.model, prompt, sample.token_ids, sampling)
        assert torch.allclose(torch.tensor(sample.log_probs), ref, atol=1e-4)
        assert all(lp <= 0 for lp in sample.log_probs)


def test_temperature_changes_log_probs(engine):
    sampling = SamplingParams(temperature=0.5, max_new_tokens=6, seed=0)
    sample = engine.generate(PROMPTS[:1], sampling)[0]
    tempered = teacher_forced(engine.model, PROMPTS[0], sample.token_ids, sampling)
    raw = teacher_forced(engine.model, PROMPTS[0], sample.token_ids, SamplingParams(temperature=1.0))
    assert torch.allclose(torch.tensor(sample.log_probs), tempered, atol=1e-4)
    assert (tempered - raw).abs().max() > 1e-3


def test_sampling_log_probs_hand_computed():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    t2 = sampling_log_probs(logits, temperature=2.0)
    z = sum(math.exp(x / 2) for x in (2.0, 1.0, 0.0, -1.0))
    assert torch.allclose(t2, torch.tensor([[math.log(math.exp(x / 2) / z) for x in (2.0, 1.0, 0.0, -1.0)]]))
    top2 = sampling_log_probs(logits, temperature=2.0, top_k=2)
    z2 = math.exp(1.0) + math.exp(0.5)
    assert torch.allclose(top2[0, :2], torch.tensor([math.log(math.exp(1.0) / z2), math.log(math.exp(0.5) / z2)]))
    assert torch.isinf(top2[0, 2:]).all()
    # probs at T=1: [0.6439, 0.2369, 0.0871, 0.0321]; top_p=0.7 keeps the first two (0.6439 < 0.7)
    nucleus = sampling_log_probs(logits, temperature=1.0, top_p=0.7)
    assert torch.isfinite(nucleus[0, :2]).all() and torch.isinf(nucleus[0, 2:]).all()
    assert torch.allclose(nucleus[0, :2].exp().sum(), torch.tensor(1.0))
    only_first = sampling_log_probs(logits, temperature=1.0, top_p=0.5)
    assert only_first[0, 0].item() == 0.0 and torch.isinf(only_first[0, 1:]).all()
    greedy = sampling_log_probs(logits, temperature=0.0, top_k=1)
    assert torch.allclose(greedy, torch.log_softmax(logits, -1))


def test_greedy_is_deterministic_and_batch_invariant(engine):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    first = engine.generate(PROMPTS, greedy)
    again = engine.generate(PROMPTS, greedy)
    alone = [engine.generate([p], greedy)[0] for p in PROMPTS]
    assert [s.token_ids for s in first] == [s.token_ids for s in again] == [s.token_ids for s in alone]
    for a, b in zip(first, alone, strict=True):
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4)


SHARED = list(range(100, 100 + MIN_SHARED_PREFIX + 4))  # a common prefix long enough to be prefilled once
SHARED_PROMPTS = [SHARED + [7, 8, 9], SHARED + [5], SHARED + [5, 6, 1, 2, 3, 4], SHARED[:-1] + [11]]


def test_shared_prefix_length():
    assert _shared_prefix_len(SHARED_PROMPTS) == len(SHARED) - 1
    assert _shared_prefix_len(SHARED_PROMPTS[:3]) == len(SHARED)
    assert _shared_prefix_len([[1, 2, 3], [1, 2, 3]]) == 2  # each row keeps a token of its own
    assert _shared_prefix_len([[1, 2], [3, 2]]) == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_prefill_equals_separate_prompts(engine, temperature):
    """Prompts with a long common prefix (prefilled once, KV cache repeated, suffixes left-padded after it) give
    the samples and log-probs of each prompt run alone and of a teacher-forced forward pass."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=8, seed=4)
    engine.batch_size = len(SHARED_PROMPTS)
    batched = engine.generate(SHARED_PROMPTS, sampling)
    for prompt, sample in zip(SHARED_PROMPTS, batched, strict=True):
        ref = teacher_forced(engine.model, prompt, sample.token_ids, sampling)
        assert torch.allclose(torch.tensor(sample.log_probs), ref, atol=1e-4)
    if temperature == 0.0:
        alone = [engine.generate([p], sampling)[0] for p in SHARED_PROMPTS]
        assert [s.token_ids for s in batched] == [s.token_ids for s in alone]


def test_temperature_zero_decodes_the_argmax(engine):
    """Greedy (validation's default, rollout.val_temperature=0): each token is the argmax of the model's logits,
    and its reported log-prob is the finite, untempered T=1 value (no division by the zero temperature)."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6, seed=11)
    for prompt, sample in zip(PROMPTS, engine.generate(PROMPTS, greedy), strict=True):
        with torch.no_grad():
            logits = engine.model(torch.tensor([prompt + sample.token_ids])).logits[0, len(prompt) - 1 : -1]
        assert sample.token_ids == logits.argmax(-1).tolist()
        expected = torch.log_softmax(logits.float(), -1).max(-1).values
        assert torch.allclose(torch.tensor(sample.log_probs), expected, atol=1e-4)
        assert all(math.isfinite(lp) and lp <= 0 for lp in sample.log_probs)


def test_seeded_sampling_is_reproducible(engine):
    ids = [[s.token_ids for s in engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, seed=s))]
           for s in (5, 5, 6)]
    assert ids[0] == ids[1]
    assert ids[0] != ids[2]


def test_max_new_tokens_gives_length(engine):
    samples = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=4, seed=0))
    assert all(len(s.token_ids) == 4 and s.finish_reason == "length" for s in samples)
    empty = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=0))
    assert [(s.token_ids, s.log_probs, s.finish_reason) for s in empty] == [([], [], "length")] * 2


def _first_index(ids, predicate):
    return next(i for i in range(len(ids)) if predicate(i))


def test_stop_token_ids_cut_after_first_occurrence(engine):
    full = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12))
    stop_id = full[0].token_ids[5]
    cut = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop_id,)))
    for f, c in zip(full, cut, strict=True):
        if stop_id in f.token_ids:
            end = f.token_ids.index(stop_id) + 1
            assert (c.token_ids, c.finish_reason) == (f.token_ids[:end], "stop")
            assert c.log_probs == pytest.approx(f.log_probs[:end], abs=1e-5)
        else:
            assert (c.token_ids, c.finish_reason) == (f.token_ids, "length")


def test_stop_strings_keep_completing_token(engine, default_tokenizer):
    tok = default_tokenizer
    full = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12))[0].token_ids
    k = _first_index(full, lambda i: i >= 3 and tok.decode([full[i]]).strip())
    stop = tok.decode([full[k]]).strip()[-2:]
    cut = engine.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=12, stop=("", stop)))[0]
    end = _first_index(full, lambda i: stop in tok.decode(full[: i + 1])) + 1
    assert end <= k + 1
    assert (cut.token_ids, cut.finish_reason) == (full[:end], "stop")
    assert stop in tok.decode(cut.token_ids) and stop not in tok.decode(cut.token_ids[:-1])


def test_eos_stops_generation(engine):
    def force_eos(module, inputs, output):
        bias = torch.zeros(output.shape[-1])
        bias[2] = 100.0
        return output + bias

    handle = engine.model.lm_head.register_forward_hook(force_eos)
    try:
        samples = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=5, seed=0))
    finally:
        handle.remove()
    assert [(s.token_ids, s.finish_reason) for s in samples] == [([2], "stop")] * len(PROMPTS)
    assert all(abs(s.log_probs[0]) < 1e-6 for s in samples)


def test_update_weights_makes_engine_equal_new_model(engine, default_tokenizer):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    other = tiny_model(tokenizer=default_tokenizer, seed=1)
    reference = HFEngine(other, default_tokenizer).generate(PROMPTS, greedy)
    before = engine.generate(PROMPTS, greedy)
    assert [s.token_ids for s in before] != [s.token_ids for s in reference]
    engine.update_weights((f"module.{k}", v) for k, v in other.state_dict().items())
    after = engine.generate(PROMPTS, greedy)
    assert [s.token_ids for s in after] == [s.token_ids for s in reference]
    for a, r in zip(after, reference, strict=True):
        assert a.log_probs == pytest.approx(r.log_probs, abs=1e-6)
    partial = {"model.norm.weight": torch.zeros(64)}
    engine.update_weights(partial)
    assert torch.equal(engine.model.model.norm.weight, torch.zeros(64))


def test_update_weights_rejects_bad_names_and_shapes(engine):
    with pytest.raises(ValueError, match="unknown parameter 'nope'"):
        engine.update_weights({"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="has shape"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)})


def test_bad_inputs_raise_clear_errors(engine):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1], []], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, 10**6]], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([[1]], SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[1]], SamplingParams(top_p=0.0))
    assert engine.generate([], SamplingParams()) == []


def test_generate_restores_training_mode_and_sleep_wake_on_cpu(engine, default_tokenizer):
    def placement(e):  # (device, dtype) of every floating-point parameter and buffer of the engine's model
        tensors = [*e.model.parameters(), *e.model.buffers()]
        return {(t.device, t.dtype) for t in tensors if t.is_floating_point()}

    cpu = torch.device("cpu")
    engine.model.train()
    engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2, seed=0))
    assert engine.model.training
    assert placement(engine) == {(cpu, torch.float32)}
    engine.sleep()
    engine.wake()
    assert placement(engine) == {(cpu, torch.float32)}
    # a model object of another dtype is cast in place to the engine's dtype, and update_weights keeps it there
    model = tiny_model(tokenizer=default_tokenizer, seed=0)
    e64 = HFEngine(model, default_tokenizer, dtype=torch.float64)
    assert e64.model is model and (e64.device, e64.dtype) == (cpu, torch.float64)
    assert placement(e64) == {(cpu, torch.float64)}
    other = tiny_model(tokenizer=default_tokenizer, seed=1).state_dict()
    e64.update_weights(other)
    assert placement(e64) == {(cpu, torch.float64)}
    state = e64.model.state_dict()
    assert all(torch.equal(state[k], v.double()) for k, v in other.items())
    sample = e64.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=3))[0]
    assert len(sample.token_ids) == 3 and placement(e64) == {(cpu, torch.float64)}


def test_default_model_log_probs_and_end_of_turn(default_tokenizer):
    engine = HFEngine()  # the packaged default model, fp32
    prompt = default_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    sampling = SamplingParams(temperature=0.7, max_new_tokens=16, seed=0)
    sample = engine.generate([prompt], sampling)[0]
    ref = teacher_forced(engine.model, list(prompt), sample.token_ids, sampling)
    assert torch.allclose(torch.tensor(sample.log_probs), ref, atol=1e-4)
    if sample.finish_reason == "stop":
        assert sample.token_ids[-1] == default_tokenizer.convert_tokens_to_ids("<|im_end|>")
    else:
        assert len(sample.token_ids) == 16 and 2 not in sample.token_ids
