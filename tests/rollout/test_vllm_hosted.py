"""A real vLLM engine (CPU build, vLLM 0.32.0) hosted by each actor rank (``ragen.workers.engine_host``): vLLM in the
worker's process, built and put to sleep before the training model, synced in place from the actor's weights. Its
sampling log-probs equal the trainer's log-probs of the same tokens after the first load, drift after an update,
and come back after the sync: the core of vLLM inside the training loop. One rank (in-process, vLLM's uniprocess
executor) and two (Ray actors over gloo, each engine joining the ranks' process group with vLLM's
``external_launcher`` executor and playing its share of the prompts).

Runs only where vLLM imports (``scripts/test_vllm.sh``); a tiny random model with head size 64 (the CPU attention
kernels' sizes) saved to a folder.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here; build its env with scripts/setup_vllm_env.sh")

from ragen.models import load_tokenizer, tiny_model  # noqa: E402
from ragen.rollout.base import SamplingParams  # noqa: E402
from ragen.trainer.hosted import HostedEngines  # noqa: E402
from ragen.trainer.placement import wake_and_sync  # noqa: E402
from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch  # noqa: E402
from ragen.workers.engine_host import EngineSpec  # noqa: E402

pytestmark = pytest.mark.vllm
LOGPROB_ATOL = 2e-3  # fp32 vLLM kernels vs the fp32 trainer forward (summation order)
PROMPTS = [[5, 17, 230, 4, 88, 91], [9, 9, 12, 300, 301], [300, 2, 44, 61, 7, 8], [77, 78, 79, 80]]


def _gap(group: LocalWorkerGroup, hosted: HostedEngines) -> float:
    """Largest |engine sampling log-prob - trainer log-prob| over the tokens the engine samples for ``PROMPTS``."""
    samples = hosted.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=8, seed=4))
    rows = [p + s.token_ids for p, s in zip(PROMPTS, samples, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn, resp, engine = torch.zeros_like(ids), torch.zeros_like(ids), torch.zeros(len(rows), width)
    for i, (p, s) in enumerate(zip(PROMPTS, samples, strict=True)):
        n = len(p) + len(s.token_ids)
        ids[i, :n], attn[i, :n], resp[i, len(p):n] = torch.tensor(p + s.token_ids), 1, 1
        engine[i, len(p):n] = torch.tensor(s.log_probs)
    trainer = group.call("compute_log_probs", TrainBatch(ids, attn, resp))
    return float((engine - trainer)[resp.bool()].abs().max())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tok = load_tokenizer()
    path = tmp_path_factory.mktemp("tiny")
    tiny_model(hidden_size=128, num_heads=2, tokenizer=tok, seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), tok


def _spec(folder) -> EngineSpec:
    path, tok = folder
    return EngineSpec("vllm", {"model": path, "tokenizer": tok, "dtype": "float32", "enforce_eager": True,
                               "max_model_len": 256, "max_num_seqs": 8, "seed": 0})


CFG = ActorConfig(lr=3e-2, mini_batch_size=4, micro_batch_size=2, mixed_precision="fp32")


def _follows_the_actor(group, hosted: HostedEngines) -> None:
    """First load, three updates (the engines fall behind), a sync (they catch up)."""
    wake_and_sync(hosted, hosted.sync_weights)  # the first load
    assert _gap(group, hosted) < LOGPROB_ATOL
    ids = torch.tensor(PROMPTS[2] * 2)[None].repeat(4, 1)
    attn, resp = torch.ones_like(ids), torch.zeros_like(ids)
    resp[:, 6:] = 1
    b = TrainBatch(ids, attn, resp, advantages=torch.ones(4, 12) * resp)
    for _ in range(3):
        group.call("update", b.with_fields(old_log_probs=group.call("compute_log_probs", b)))
    assert _gap(group, hosted) > 10 * LOGPROB_ATOL  # the engines still sample with the old weights
    hosted.sleep()
    wake_and_sync(hosted, hosted.sync_weights)
    assert hosted.last_sync["tensors"] > 0 and hosted.last_sync["bytes"] > 0
    assert _gap(group, hosted) < LOGPROB_ATOL  # the engines' log-probs moved to the trainer's


def test_one_rank_hosts_vllm_in_process(folder):
    group = LocalWorkerGroup(PolicyWorker, model_name_or_path=folder[0], cfg=CFG, engine=_spec(folder))
    engine = group.worker.engine_host.engine
    assert type(engine).__name__ == "VLLMEngine"
    assert engine._as_bytes is False  # in-process: buckets of tensors, no byte copies
    _follows_the_actor(group, HostedEngines(group))


def test_two_ranks_host_one_vllm_engine_each(folder):
    import ray

    from ragen.workers import WorkerGroup

    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ["VLLM_CPU_KVCACHE_SPACE"]}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env})
    try:
        group = WorkerGroup(PolicyWorker, 2, resources_per_worker={"CPU": 1}, model_name_or_path=folder[0], cfg=CFG,
                            engine=_spec(folder))
        try:
            _follows_the_actor(group, HostedEngines(group))
        finally:
            group.shutdown()
    finally:
        ray.shutdown()
