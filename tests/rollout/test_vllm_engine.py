"""Parts of the vLLM engine that need no vLLM: sampling conversion, per-request seeds, output conversion, weight
buckets and their wire format, and the engine's call sequence against a fake ``vllm.LLM``."""

import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from ragen.rollout import SamplingParams
from ragen.rollout.vllm_engine import (
    request_seeds,
    sample_from_vllm_output,
    vllm_sampling_kwargs,
    weight_buckets,
    weight_items,
)
from ragen.rollout.vllm_worker import decode_bucket, encode_tensor


def test_sampling_kwargs_conversion():
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=33, stop=("</answer>", ""),
                        stop_token_ids=(5,), seed=11)
    kw = vllm_sampling_kwargs(sp, extra_stop_token_ids=(2,), seed=1234)
    assert kw == {
        "n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 33, "stop": ["</answer>"],
        "stop_token_ids": [2, 5], "include_stop_str_in_output": True, "skip_special_tokens": False,
        "seed": 1234, "logprobs": 0,
    }
    plain = vllm_sampling_kwargs(SamplingParams(top_k=20))
    assert (plain["top_k"], plain["stop"], plain["stop_token_ids"], plain["seed"]) == (20, None, None, None)
    with pytest.raises(ValueError, match="temperature 2.5 > 2.0"):
        vllm_sampling_kwargs(SamplingParams(temperature=2.5))


def test_request_seeds_distinct_within_and_across_calls():
    assert request_seeds(None, 3) == [None, None, None]
    a, b = request_seeds(5, 64), request_seeds(6, 64)
    assert len(set(a)) == 64 and not set(a) & set(b)  # seed + i would overlap the next call's seeds
    assert a == request_seeds(5, 64) and all(0 <= s < 2**63 - 1 for s in a)


def _output(token_ids, logprob_values, finish_reason, stop_reason=None, cached=None):
    logprobs = [
        {tid: SimpleNamespace(logprob=lp, rank=1), tid + 1: SimpleNamespace(logprob=-9.0, rank=2)}
        for tid, lp in zip(token_ids, logprob_values, strict=True)
    ]
    completion = SimpleNamespace(token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
                                 stop_reason=stop_reason)
    return SimpleNamespace(outputs=[completion], num_cached_tokens=cached)


def test_result_conversion_keeps_every_finish_reason():
    sample = sample_from_vllm_output(_output([10, 20, 2], [-0.5, -1.25, -0.01], "stop", stop_reason=2, cached=32))
    assert (sample.token_ids, sample.log_probs, sample.finish_reason) == ([10, 20, 2], [-0.5, -1.25, -0.01], "stop")
    assert sample.extra == {"stop_reason": 2, "num_cached_tokens": 32}
    length = sample_from_vllm_output(_output([7], [-2.0], "length"))
    assert (length.finish_reason, length.extra) == ("length", {})
    for reason in ("abort", "error", "repetition"):
        assert sample_from_vllm_output(_output([7], [-2.0], reason)).finish_reason == reason
    unfinished = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[], logprobs=None, finish_reason=None)])
    assert sample_from_vllm_output(unfinished).finish_reason == "abort"


def test_result_conversion_requires_logprobs():
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1], logprobs=None, finish_reason="stop")])
    with pytest.raises(ValueError, match="logprobs=0"):
        sample_from_vllm_output(out)


def test_weight_items_refuse_dtensors_instead_of_gathering_in_the_driver():
    w = torch.ones(2)
    assert list(weight_items({"a": w})) == [("a", w)]
    sharded = SimpleNamespace(full_tensor=lambda: pytest.fail("full_tensor is a collective; never call it here"))
    with pytest.raises(TypeError, match="full_state_dict"):
        list(weight_items(iter([("b", sharded)])))


def test_weight_buckets_cast_split_and_round_trip():
    gen = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(4, 8, generator=gen), "b": torch.randn(100, generator=gen),
             "c": torch.randn(3, generator=gen), "steps": torch.tensor([3, 4])}
    # bf16: a = 64 B, b = 200 B, c = 6 B; budget 100 B -> [a], [b] (alone: larger than the budget), [c, steps]
    buckets = list(weight_buckets(state, torch.bfloat16, bucket_bytes=100))
    assert [[item[0] for item in b] for b in buckets] == [["a"], ["b"], ["c", "steps"]]
    assert all(isinstance(item[3], bytes) for b in buckets for item in b)
    back = dict(pair for b in buckets for pair in decode_bucket(b))
    for name, tensor in state.items():
        want = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert back[name].dtype == want.dtype and torch.equal(back[name], want)
    in_process = list(weight_buckets(state, torch.float32, as_bytes=False))
    assert len(in_process) == 1 and torch.equal(in_process[0][0][3], state["a"])
    assert encode_tensor("x", torch.zeros(2, 3))[1:3] == ("float32", (2, 3))
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(weight_buckets(state, torch.float32, bucket_bytes=0))


class FakeLLM:
    """Records the calls ``VLLMEngine`` makes on ``vllm.LLM``."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []

    def get_tokenizer(self):
        return SimpleNamespace(eos_token_id=2)

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", [p["prompt_token_ids"] for p in prompts], params))
        return [_output([9, 2], [-0.1, -0.2], "stop") for _ in prompts]

    def collective_rpc(self, method, args=()):
        if method == "ragen_load_weights":  # one bucket: record (name, dtype) of each item
            self.calls.append((method, [(item[0], item[1]) for item in args[0]]))
        else:
            self.calls.append((method, args))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    module = ModuleType("vllm")
    module.__version__ = "0.32.0"
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: kw
    platforms = ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr("ragen.rollout.vllm_engine.resolve_model_path", lambda name, cache_dir=None: str(tmp_path))
    return module


def test_engine_call_sequence_with_fake_llm(fake_vllm):
    from ragen.rollout.vllm_engine import EXTENSION_CLS, VLLMEngine

    engine = VLLMEngine("m", device="cuda", dtype="bfloat16", enable_sleep_mode=True, gpu_memory_utilization=0.3,
                        tensor_parallel_size=2, max_num_seqs=64, enforce_eager=True, bucket_bytes=16)
    llm = engine.llm
    assert llm.kwargs["worker_extension_cls"] == EXTENSION_CLS == "ragen.rollout.vllm_worker.WeightLoaderExtension"
    assert (llm.kwargs["gpu_memory_utilization"], llm.kwargs["tensor_parallel_size"], llm.kwargs["max_num_seqs"],
            llm.kwargs["enable_sleep_mode"], llm.kwargs["logprobs_mode"]) == (0.3, 2, 64, True, "processed_logprobs")
    samples = engine.generate([[1, 2], [1, 2], [1, 2]], SamplingParams(temperature=1.0, seed=3, stop_token_ids=(7,)))
    _, prompts, params = llm.calls[0]
    assert prompts == [[1, 2]] * 3 and isinstance(params, list) and len(params) == 3
    assert [p["seed"] for p in params] == request_seeds(3, 3) and len({p["seed"] for p in params}) == 3
    assert all(p["stop_token_ids"] == [2, 7] for p in params)  # the tokenizer's eos (end of turn) is added
    assert [s.token_ids for s in samples] == [[9, 2]] * 3
    engine.sleep()
    engine.wake(("weights",))
    sent = engine.update_weights({"w1": torch.ones(4), "w2": torch.ones(8)})  # bf16: 8 B + 16 B, 16 B buckets
    engine.wake(("kv_cache",))
    assert sent == 2
    assert llm.calls[1:] == [
        ("sleep", 1), ("wake_up", ["weights"]), ("ragen_begin_weight_update", ()),
        ("ragen_load_weights", [("w1", "bfloat16")]), ("ragen_load_weights", [("w2", "bfloat16")]),
        ("ragen_finish_weight_update", ()), ("reset_prefix_cache",), ("wake_up", ["kv_cache"]),
    ]


def test_engine_refuses_mismatched_platform_and_sleep_on_cpu(fake_vllm):
    from ragen.rollout.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="CPU build of vLLM"):
        VLLMEngine("m", device="cpu")
    sys.modules["vllm.platforms"].current_platform = SimpleNamespace(is_cpu=lambda: True)
    with pytest.raises(ValueError, match="asked for cuda"):
        VLLMEngine("m", device="cuda")
    with pytest.raises(ValueError, match="enable_sleep_mode needs GPUs"):
        VLLMEngine("m", device="cpu", enable_sleep_mode=True)
    engine = VLLMEngine("m", device="cpu")
    assert "gpu_memory_utilization" not in engine.llm.kwargs
    engine.sleep()
    engine.wake()
    assert engine.llm.calls == []  # no sleep mode: sleep/wake are no-ops


def test_nccl_sync_protocol_order_with_fakes():
    """Separate placement: metadata through RPC, tensors by broadcast; receive + send of a bucket both in flight
    before waiting, one bucket at a time, then reset of the prefix cache."""
    from ragen.rollout.vllm_nccl import plan_buckets, sync_over_nccl

    metas = [("a", "bfloat16", (4, 8)), ("b", "bfloat16", (100,)), ("c", "float32", (3,))]
    plan = plan_buckets(metas, bucket_bytes=100)  # 64 B, 200 B (alone), 12 B
    assert plan.buckets == ((metas[0],), (metas[1],), (metas[2],))
    assert plan_buckets(metas, bucket_bytes=1 << 20).buckets == (tuple(metas),)
    log = []

    def engine_rpc(method, *args):
        log.append(("engine", method, args))
        return f"engine:{method}"

    def sender_call(method, *args):
        log.append(("sender", method, args))
        return f"sender:{method}"

    sent = sync_over_nccl(engine_rpc, sender_call, plan, wait=lambda refs: log.append(("wait", tuple(refs))),
                          reset_prefix_cache=lambda: log.append(("reset",)))
    assert sent == 3
    bucket_calls = []
    for i, m in enumerate(plan.buckets):
        bucket_calls += [("engine", "ragen_receive_bucket", (list(m),)), ("sender", "broadcast_bucket", (i,)),
                         ("wait", ("engine:ragen_receive_bucket", "sender:broadcast_bucket"))]
    assert log == [("engine", "ragen_begin_weight_update", ()), ("wait", ("engine:ragen_begin_weight_update",)),
                   *bucket_calls,
                   ("engine", "ragen_finish_weight_update", ()), ("wait", ("engine:ragen_finish_weight_update",)),
                   ("reset",)]


def test_receiver_refuses_before_the_group_exists():
    from ragen.rollout.vllm_worker import WeightLoaderExtension

    with pytest.raises(RuntimeError, match="ragen_init_weight_group must run"):
        WeightLoaderExtension().ragen_receive_bucket([("a", "float32", (1,))])


def test_engine_rpc_only_reaches_ragen_methods(fake_vllm):
    from ragen.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine("m", device="cuda")
    engine.rpc("ragen_init_weight_group", "10.0.0.1", 29500, 1, 2)
    assert engine.llm.calls == [("ragen_init_weight_group", ("10.0.0.1", 29500, 1, 2))]
    with pytest.raises(ValueError, match="only ragen_"):
        engine.rpc("execute_model")
