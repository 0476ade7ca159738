"""The real ``VLLMEngine`` (vLLM 0.32.0, CPU build) on the default model, against the hf engine and a
teacher-forced pass of the same weights.

Runs only where vLLM imports: the env built by ``scripts/setup_vllm_env.sh`` (``scripts/test_vllm.sh`` runs these).
Elsewhere the module is skipped with the reason. Both engines run fp32, so greedy ids must be identical and
log-probs agree to ``LOGPROB_ATOL`` (fp32 kernels differ only in summation order; a bf16 engine would need ~0.1).
One engine (started once, ~30 s idle / ~100 s on a busy 2-core machine) serves every test; its KV cache is
capped at 1 GiB (``VLLM_CPU_KVCACHE_SPACE``).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here; build its env with scripts/setup_vllm_env.sh")

from ragen.models import load_tokenizer  # noqa: E402
from ragen.models.loader import DEFAULT_MODEL, resolve_model_path  # noqa: E402
from ragen.rollout.base import SamplingParams  # noqa: E402
from ragen.rollout.hf import HFEngine  # noqa: E402

pytestmark = pytest.mark.vllm
LOGPROB_ATOL = 2e-3  # fp32 engine vs fp32 transformers forward
MAX_LEN = 1024


@pytest.fixture(scope="module")
def engines():
    """(vllm engine, hf engine, tokenizer) over the default model's cached folder, both fp32."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from ragen.rollout.vllm_engine import VLLMEngine

    path = resolve_model_path(DEFAULT_MODEL)
    tok = load_tokenizer(path)
    vllm_engine = VLLMEngine(path, tok, device="cpu", dtype="float32", enforce_eager=True, max_model_len=MAX_LEN,
                             max_num_seqs=8, bucket_bytes=64 << 20)
    hf_engine = HFEngine(path, tok, dtype="float32", batch_size=8)
    yield vllm_engine, hf_engine, tok
    del vllm_engine


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)


def teacher_forced(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """log p(response_t | prompt, response_<t) under ``softmax(logits / T)`` (T = 1 for greedy), one forward."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / scale, dim=-1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


PROMPTS = ["What is the capital of France? Answer in one word.", "Count from one to five.",
           "Name a colour of the sky."]


def test_greedy_equals_hf_engine_and_ends_with_end_of_turn(engines):
    vllm_engine, hf_engine, tok = engines
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=40)
    got = vllm_engine.generate(prompts, sampling)
    want = hf_engine.generate(prompts, sampling)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert [s.finish_reason for s in got] == [s.finish_reason for s in want]
    ended = [s for s in got if s.finish_reason == "stop"]
    assert ended, "the default model should end at least one of these short answers"
    for s in ended:  # the end-of-turn id (tokenizer eos) is kept as the last token, and only there
        assert s.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in s.token_ids[:-1]
    for g, w in zip(got, want, strict=True):  # greedy reports the T = 1 log-probs, as the hf engine does
        assert g.log_probs == pytest.approx(w.log_probs, abs=LOGPROB_ATOL)


def test_sampled_log_probs_match_teacher_forcing_and_group_members_differ(engines):
    vllm_engine, hf_engine, tok = engines
    prompt = chat_ids(tok, "Write a short sentence about the sea.")
    samples = vllm_engine.generate([prompt] * 4, SamplingParams(temperature=0.8, max_new_tokens=16, seed=7))
    assert len({tuple(s.token_ids) for s in samples}) == 4, "group members got identical samples"
    for s in samples:
        assert len(s.log_probs) == len(s.token_ids) > 0
        ref = teacher_forced(hf_engine.model, prompt, s.token_ids, temperature=0.8)
        assert s.log_probs == pytest.approx(ref, abs=LOGPROB_ATOL)
    again = vllm_engine.generate([prompt] * 4, SamplingParams(temperature=0.8, max_new_tokens=16, seed=7))
    assert [s.token_ids for s in again] == [s.token_ids for s in samples]  # per-request seeds are reproducible


def test_stop_id_and_stop_string_cut_like_the_hf_engine(engines):
    vllm_engine, hf_engine, tok = engines
    prompt = chat_ids(tok, "Count from one to ten, separated by commas.")
    free = vllm_engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=24))[0].token_ids
    k = next(i for i in range(3, len(free)) if free[i] not in free[:i])  # a token first seen at position k >= 3
    by_id = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=(free[k],))
    got = vllm_engine.generate([prompt], by_id)[0]
    assert (got.token_ids, got.finish_reason) == (free[: k + 1], "stop")
    assert got.token_ids == hf_engine.generate([prompt], by_id)[0].token_ids
    # a stop string completed by token k: the text of tokens [k-1, k] (spans a token boundary), kept in the output
    stop_text = tok.decode(free[k - 1 : k + 1], skip_special_tokens=False)
    by_text = SamplingParams(temperature=0.0, max_new_tokens=24, stop=(stop_text,))
    got = vllm_engine.generate([prompt], by_text)[0]
    want = hf_engine.generate([prompt], by_text)[0]
    assert got.finish_reason == want.finish_reason == "stop"
    assert got.token_ids == want.token_ids
    assert tok.decode(got.token_ids, skip_special_tokens=False).endswith(stop_text)


def teacher_forced_original(hf_engine, original, prompt, response):
    """Teacher-forced greedy log-probs under the ``original`` weights (the hf engine is put back to the new ones)."""
    with torch.no_grad():
        current = {k: v.clone() for k, v in hf_engine.model.state_dict().items() if v.ndim == 2}
    hf_engine.update_weights(original)
    try:
        return teacher_forced(hf_engine.model, prompt, response, temperature=0.0)
    finally:
        hf_engine.update_weights(current)
        del current


def test_update_weights_follows_new_weights_and_resets_prefix_cache(engines):
    vllm_engine, hf_engine, tok = engines
    block = vllm_engine.llm.llm_engine.vllm_config.cache_config.block_size
    filler = " ".join(f"item{i}" for i in range(block))  # > 1 block of shared prompt, so the prefix cache hits
    prompt = chat_ids(tok, f"Here is a list: {filler}. Which item comes first?")
    assert block < len(prompt) < MAX_LEN - 40
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = vllm_engine.generate([prompt], greedy)[0]
    cached = vllm_engine.generate([prompt], greedy)[0]
    assert cached.extra["num_cached_tokens"] >= block  # the second call reused the first call's KV blocks
    original = {k: v.clone() for k, v in hf_engine.model.state_dict().items()}

    def perturbed():  # the same noise on every call, generated lazily (no second copy of the model in memory)
        gen = torch.Generator().manual_seed(0)
        for k, v in original.items():
            yield k, (v + 0.02 * v.std() * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v)

    try:
        sent = vllm_engine.update_weights(perturbed())
        assert sent == len(original)
        hf_engine.update_weights(perturbed())
        after = vllm_engine.generate([prompt], greedy)[0]
        assert after.extra.get("num_cached_tokens", 0) == 0  # reset_prefix_cache dropped the old weights' KV
        want = hf_engine.generate([prompt], greedy)[0]
        assert after.token_ids == want.token_ids
        ref = teacher_forced(hf_engine.model, prompt, after.token_ids, temperature=0.0)
        assert after.log_probs == pytest.approx(ref, abs=LOGPROB_ATOL)
        old = teacher_forced_original(hf_engine, original, prompt, after.token_ids)
        assert max(abs(a - b) for a, b in zip(after.log_probs, old, strict=True)) > 20 * LOGPROB_ATOL
    finally:  # restore both engines for the other tests
        vllm_engine.update_weights(original)
        hf_engine.update_weights(original)
    restored = vllm_engine.generate([prompt], greedy)[0]
    assert restored.token_ids == before.token_ids
    assert restored.log_probs == pytest.approx(before.log_probs, abs=LOGPROB_ATOL)


def test_a_remote_handle_reports_the_engines_own_sleep_state(engines):
    """The separate placement's ``RemoteEngine`` asks the engine in the actor what is asleep (here the actor handle
    calls the real engine in this process)."""
    from types import SimpleNamespace

    from ragen.rollout.base import ENGINE_PARTS
    from ragen.trainer.placement import RemoteEngine

    vllm_engine = engines[0]

    class InProcessActor:  # method.remote(*args) runs the method now and returns its result as the "ref"
        def __getattr__(self, method):
            return SimpleNamespace(remote=lambda *args: getattr(vllm_engine, method)(*args))

    remote = RemoteEngine(InProcessActor(), get=lambda ref: ref)
    assert remote.asleep == frozenset()
    try:
        remote.sleep()
        assert remote.asleep == frozenset(ENGINE_PARTS)
        remote.wake(("weights",))
        assert remote.asleep == frozenset(ENGINE_PARTS) - {"weights"}
    finally:
        remote.wake()
    assert remote.asleep == frozenset()
