"""Two actor ranks (Ray actors, gloo, FSDP2 world size 2) each hosting an hf engine: after an update, every rank's
engine samples with the actor's new weights (its sampling log-probs are the trainer's log-probs of the same
tokens), and the sync's only return to the driver is a three-number summary per rank: no weight travels through
the driver (``bench/weight_sync.py`` measures Ray's object store during the sync)."""

from __future__ import annotations

import pytest
import torch
from factories import prompt_response, train_batch
from worker_helpers import random_batch

from ragen.rollout.base import SamplingParams
from ragen.trainer.hosted import HostedEngines
from ragen.trainer.placement import wake_and_sync
from ragen.workers import ActorConfig, PolicyWorker, TrainBatch, WorkerGroup
from ragen.workers.engine_host import EngineSpec

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

PROMPTS = [[5, 17, 230, 4], [9, 9, 12], [300, 2, 44, 61, 7, 8], [77, 78]]


def _replayed(prompts: list[list[int]], samples) -> TrainBatch:
    """The prompts + sampled tokens as a right-padded batch, the sampled tokens as the response."""
    return train_batch(prompt_response(prompts, [s.token_ids for s in samples]))


def _engine_gap(group: WorkerGroup, hosted: HostedEngines) -> float:
    """Largest |engine sampling log-prob - trainer log-prob| over the sampled tokens of ``PROMPTS``."""
    samples = hosted.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=6, seed=4))
    b = _replayed(PROMPTS, samples)
    trainer = group.call("compute_log_probs", b)
    engine = torch.zeros_like(trainer)
    for i, (p, s) in enumerate(zip(PROMPTS, samples, strict=True)):
        engine[i, len(p): len(p) + len(s.token_ids)] = torch.tensor(s.log_probs)
    return float((engine - trainer)[b.response_mask.bool()].abs().max())


@pytest.mark.slow
def test_each_rank_loads_its_engine_and_returns_only_a_summary(ray_cluster, model_dir):
    cfg = ActorConfig(lr=1e-2, mini_batch_size=8, micro_batch_size=4, mixed_precision="fp32")
    group = WorkerGroup(PolicyWorker, 2, resources_per_worker={"CPU": 1}, model_name_or_path=model_dir, cfg=cfg,
                        engine=EngineSpec("hf", {"model": model_dir, "dtype": "float32"}))
    try:
        hosted = HostedEngines(group)
        wake_and_sync(hosted, hosted.sync_weights)  # the first load
        assert _engine_gap(group, hosted) < 1e-4
        ids, attn, resp = random_batch(B=8, T=24, seed=7)
        b = TrainBatch(ids, attn, resp, advantages=torch.randn(8, 24, generator=torch.Generator().manual_seed(8)))
        group.call("update", b.with_fields(old_log_probs=group.call("compute_log_probs", b)))
        assert _engine_gap(group, hosted) > 1e-3  # the engines still hold the old weights
        hosted.sleep()
        refs = []
        real_call = group.call

        def recording_call(method, batch=None, **kw):  # what comes back to the driver from the ranks
            out = real_call(method, batch, **kw)
            refs.append((method, out))
            return out

        group.call = recording_call
        wake_and_sync(hosted, hosted.sync_weights)
        group.call = real_call
        assert [m for m, _ in refs] == ["engine_wake", "sync_engine_weights", "engine_wake"]
        summary = refs[1][1]
        assert set(summary) == {"tensors", "bytes", "seconds"} and all(type(v) is float for v in summary.values())
        assert refs[0][1] is None and refs[2][1] is None
        lm_bytes = sum(v.numel() * 4 for v in group.call_rank0("full_state_dict").values())
        assert summary["bytes"] == lm_bytes  # each rank loaded every weight once
        assert _engine_gap(group, hosted) < 1e-4  # both ranks' engines (2 prompts each) sample with the new weights
    finally:
        group.shutdown()
