"""Asynchronous training end to end (``trainer.async_rollout``, ``ragen.ppo.async_rollout``) on the tiny fp32 model
over multi-turn FrozenLake (ragged episodes, repeated maps within a group).

* k = 0 goes through the queue and the versioned engine and gives the synchronous loop's numbers exactly: token ids
  and advantages of every step, and the weights after 3 steps.
* Every trained token's engine log-prob is the log-prob under the weights of the version it is stamped with (and
  not under the others'), with and without partial rollouts; staleness never exceeds k.
* A resume continues the seeds after the last consumed batch: no episode twice, none skipped.
* Bad settings are refused before anything starts, naming the fix.
The longer runs are marked ``slow`` (``.ci/run``).
"""

from pathlib import Path

import pytest
import torch
from trainer_helpers import load_actor_weights, read_metrics, tiny_init_weights, tiny_overrides

from ragen.trainer import credit
from ragen.trainer.config.compose import load_train_config

BASE = ("trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0", "trainer.report=false")
ASYNC = ("trainer.async_rollout=true", "algorithm.rollout_correction.mode=token_tis")
STEP_CREDIT = credit.step_credit


def _run(out: Path, monkeypatch, steps: int, *extra: str) -> list[dict]:
    """Train ``steps`` steps of ``ppo_multi_turn`` (tiny); returns per step the batch's ids, versions, engine
    log-probs, turn ids and the advantages the update trained on."""
    from ragen.ppo.trainer import run

    seen: list[dict] = []
    real = STEP_CREDIT

    def record(alg, estimate, batch, *args):
        adv, ret, metrics = real(alg, estimate, batch, *args)
        seen.append({"ids": batch.input_ids.clone(), "adv": adv.clone(), "mask": batch.response_mask.clone(),
                     "versions": None if batch.sample_versions is None else batch.sample_versions.clone(),
                     "lp": batch.sample_log_probs.clone()})
        return adv, ret, metrics

    monkeypatch.setattr(credit, "step_credit", record)
    cfg = load_train_config("ppo_multi_turn", [*tiny_overrides(out, steps), *BASE, *extra])
    run(cfg)
    return seen


def test_k0_gives_the_synchronous_numbers(tmp_path, monkeypatch):
    sync = _run(tmp_path / "sync", monkeypatch, 3, "trainer.save_freq=3")
    asyn = _run(tmp_path / "async", monkeypatch, 3, "trainer.save_freq=3", "trainer.async_rollout=true")
    assert len(sync) == len(asyn) == 3
    for s, a in zip(sync, asyn, strict=True):
        assert torch.equal(s["ids"], a["ids"]) and torch.equal(s["adv"], a["adv"])
    assert any(float(s["adv"].abs().sum()) > 0 for s in sync)  # the steps have something to train on
    assert [int(a["versions"][a["mask"].bool()].max()) for a in asyn] == [0, 1, 2]  # step s samples version s
    w_sync = load_actor_weights(tmp_path / "sync" / "checkpoints" / "global_step_3")
    w_async = load_actor_weights(tmp_path / "async" / "checkpoints" / "global_step_3")
    init = tiny_init_weights()
    assert any(not torch.equal(w, init[k]) for k, w in w_sync.items() if k in init)  # the weights moved
    for name, w in w_sync.items():
        assert torch.equal(w, w_async[name]), name
    metrics = read_metrics(tmp_path / "async")
    assert [r["async/staleness_max"] for r in metrics if "async/staleness_max" in r] == [0.0, 0.0, 0.0]


def _token_log_probs(model, weights: dict, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T) log-prob of each token given the ones before it under ``weights`` (0 at position 0), at the sampling
    temperature."""
    from ragen.rollout.hf import sampling_log_probs

    model.load_state_dict(weights, strict=False)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    out = torch.zeros(ids.shape)
    for t in range(1, ids.shape[1]):
        out[:, t] = sampling_log_probs(logits[:, t - 1], temperature).gather(1, ids[:, t:t + 1]).squeeze(1)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("partial", [False, True], ids=["whole_batches", "partial"])
def test_every_token_was_sampled_by_the_version_it_names(tmp_path, monkeypatch, partial):
    from transformers import AutoModelForCausalLM

    from ragen.trainer.builders import prepare_model

    k, steps = 1, 4
    seen = _run(tmp_path, monkeypatch, steps, *ASYNC, f"trainer.max_staleness={k}", "trainer.save_freq=1",
                "trainer.keep_last_ckpt=null", f"trainer.partial_rollouts={str(partial).lower()}")
    cfg = load_train_config("ppo_multi_turn", [*tiny_overrides(tmp_path, steps)])
    path, _ = prepare_model(cfg)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    weights = {0: tiny_init_weights()}
    weights.update({v: load_actor_weights(tmp_path / "checkpoints" / f"global_step_{v}") for v in range(1, steps)})
    checked = 0
    for step, s in enumerate(seen):
        mask = s["mask"].bool()
        versions = s["versions"]
        assert bool((versions[mask] >= 0).all()) and bool((versions[~mask] == -1).all())
        assert step - int(versions[mask].min()) <= k and int(versions[mask].max()) <= step
        ids = s["ids"]
        for v in versions[mask].unique().tolist():
            here = mask & (versions == v)
            lp = _token_log_probs(model, weights[v], ids, cfg.agent.temperature)
            assert (lp - s["lp"])[here].abs().max() < 1e-4, (step, v)
            other = weights[v + 1] if v + 1 in weights else weights[v - 1]
            lp_other = _token_log_probs(model, other, ids, cfg.agent.temperature)
            assert (lp_other - s["lp"])[here].abs().max() > 1e-3, (step, v)  # the check can tell versions apart
            checked += int(here.sum())
    assert checked > 0
    staleness = [r["async/staleness_max"] for r in read_metrics(tmp_path) if "async/staleness_max" in r]
    assert len(staleness) == steps and max(staleness) <= k


@pytest.mark.slow
def test_resume_continues_after_the_consumed_batch(tmp_path, monkeypatch):
    whole = _run(tmp_path / "whole", monkeypatch, 4, *ASYNC, "trainer.max_staleness=1", "trainer.save_freq=2")
    _run(tmp_path / "cut", monkeypatch, 2, *ASYNC, "trainer.max_staleness=1", "trainer.save_freq=2")
    resumed = _run(tmp_path / "cut", monkeypatch, 4, *ASYNC, "trainer.max_staleness=1", "trainer.save_freq=2")
    assert len(resumed) == 2  # steps 3 and 4
    seeds = [(r["rollout/seed_min"], r["rollout/seed_max"]) for r in read_metrics(tmp_path / "cut")]
    whole_seeds = [(r["rollout/seed_min"], r["rollout/seed_max"]) for r in read_metrics(tmp_path / "whole")]
    assert seeds == whole_seeds  # the queued batch at the stop is replayed from the same seeds
    assert all(a[1] < b[0] for a, b in zip(seeds, seeds[1:], strict=False))  # no seed twice, in order
    for s, step in zip(resumed, (2, 3), strict=True):  # versions continue from the checkpoint's step
        v = s["versions"][s["mask"].bool()]
        assert step - 1 <= int(v.min()) and int(v.max()) <= step
    assert [len(w["ids"]) for w in whole[2:]] == [len(r["ids"]) for r in resumed]


@pytest.mark.parametrize("overrides, words", [
    (("trainer.max_staleness=1",), "only apply to asynchronous training"),
    (("trainer.async_rollout=true", "trainer.max_staleness=1"), "algorithm.rollout_correction.mode to one of"),
    (("trainer.async_rollout=true", "trainer.stale_policy=drop"), "use trainer.stale_policy=wait"),
    (("trainer.async_rollout=true", "trainer.device=cuda", "trainer.n_gpus_per_node=1"), "rollout.engine=vllm"),
    (("trainer.async_rollout=true", "trainer.device=cuda", "trainer.n_gpus_per_node=1", "rollout.engine=vllm"),
     "rollout.vllm.placement=separate"),
    (("trainer.async_rollout=true", "env=agent_program",
      "env.config.entry=ragen.gateway.examples.calculator:run"), "env=agent_program"),
])
def test_bad_settings_are_refused(overrides, words):
    from ragen.trainer.config.ppo_checks import check_async

    problems = check_async(load_train_config("base", list(overrides)))
    assert any(words in p for p in problems), problems


def test_negative_staleness_is_refused():
    from ragen.trainer.config.schema import ConfigError

    with pytest.raises((ConfigError, ValueError), match="max_staleness must be >= 0"):
        load_train_config("base", ["trainer.max_staleness=-1"])


@pytest.mark.slow
def test_a_restart_replays_the_queue_and_resets_the_version(tmp_path, monkeypatch):
    """The actor dies in step 2's update: the rollout thread stops, its queue is discarded, the run rewinds to the
    step-1 checkpoint, and the replayed batches carry versions counted from there (never the dead step's)."""
    from ragen.workers.group import LocalWorkerGroup, WorkerFailure

    real, updates = LocalWorkerGroup.call, {"n": 0}

    def call(self, method, batch=None, **kw):
        if method == "update" and getattr(self.worker, "role", None) == "actor":
            updates["n"] += 1
            if updates["n"] == 2:
                raise WorkerFailure("actor worker rank 0 died during update() (simulated)")
        return real(self, method, batch, **kw)

    whole = _run(tmp_path / "whole", monkeypatch, 3, *ASYNC, "trainer.max_staleness=1", "trainer.save_freq=1")
    monkeypatch.setattr(LocalWorkerGroup, "call", call)
    seen = _run(tmp_path / "restarted", monkeypatch, 3, *ASYNC, "trainer.max_staleness=1", "trainer.save_freq=1",
                "trainer.max_restarts=1")
    assert updates["n"] == 4  # steps 1, 2 (died), 2 again, 3
    records = read_metrics(tmp_path / "restarted")
    assert [r["trainer/restarts"] for r in records if "trainer/restarts" in r] == [0.0, 1.0, 1.0]
    seeds = [(r["rollout/seed_min"], r["rollout/seed_max"]) for r in records if "rollout/seed_min" in r]
    assert seeds == [(r["rollout/seed_min"], r["rollout/seed_max"]) for r in read_metrics(tmp_path / "whole")
                     if "rollout/seed_min" in r]  # each batch trained once, the dead step's replayed
    for s, step in zip(seen[-2:], (1, 2), strict=True):
        v = s["versions"][s["mask"].bool()]
        assert step - 1 <= int(v.min()) and int(v.max()) <= step
    assert len(whole) == 3


@pytest.mark.slow
@pytest.mark.parametrize("skip_sync", [False, True], ids=["synced", "sync_skipped_control"])
def test_lora_weights_reach_the_engine_at_each_version(tmp_path, monkeypatch, skip_sync):
    """LoRA (adapters merged into the engine's weights), k = 0: each step's engine log-probs equal the trainer's
    recomputed ones (the proximal policy is the version that sampled); with the weight loads skipped (the negative
    control) they drift apart from step 2 on."""
    from ragen.rollout.versioned import VersionedEngine

    if skip_sync:
        real = VersionedEngine.publish
        monkeypatch.setattr(VersionedEngine, "publish", lambda self, version, load: real(self, version, None))
    _run(tmp_path, monkeypatch, 3, *ASYNC, "actor.lora_rank=4")
    records = [r for r in read_metrics(tmp_path) if "rollout/logprob_diff_max" in r]
    diffs = [r["rollout/logprob_diff_max"] for r in records]
    assert len(diffs) == 3 and diffs[0] < 1e-4 and all(r["actor/grad_norm"] > 0 for r in records)
    if skip_sync:
        assert max(diffs[1:]) > 1e-3, diffs
    else:
        assert max(diffs) < 1e-4, diffs
