"""Workers build on the meta device and each rank reads only its own shards (``ragen.workers.materialize``).

Two gloo ranks, each a fresh process (``spawned_ranks``), build from a saved random model of 0.42 GiB fp32
(``tiny_model`` at hidden 1024, 4 layers: 113M parameters, 49152-token vocab, tied embeddings) and are checked
against a plain load of the same folder (``from_pretrained``, the way workers loaded before):
  - weights: the gathered state dict equals the plain model's bit for bit (LoRA: the base and the adapters of
    ``add_lora`` on the plain model with the same seed; a bf16 reference: the plain weights rounded to bf16);
  - outputs on one batch: log-probs (actor, LoRA actor, reference) and values (critic) equal the plain model's
    computed on the same rows and chunks (fp32: exactly; the bf16 reference within ``BF16_REF_ATOL`` of the
    fp32-weight reference computing in bf16);
  - memory: each rank's peak RSS grows by at most its half of the model plus ``FIXED_GB`` (config, tokenizer,
    process group, allocator slack; measured 0.06 GiB) while it builds, and a resume (``load``) of a checkpoint
    adds at most ``FIXED_GB``. A build that loads the whole model on every rank grows by more than one full copy.
    World size 1 holds the model once: at most one copy plus ``FIXED_GB``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from spawned_ranks import rank_rows, run_ranks
from worker_helpers import random_batch

from ragen.workers import ActorConfig
from ragen.workers.data import TrainBatch
from ragen.workers.trainable import forward_in_chunks

pytestmark = pytest.mark.slow

WORLD = 2
FIXED_GB = 0.1
# bf16 weights keep the residual stream and norms in bf16 where fp32 weights under autocast round only the matmul
# inputs: measured 0.024 (max over the response tokens, |log p| ~ 11 for the 49152-token vocab)
BF16_REF_ATOL = 0.05
CFG = {"mixed_precision": "fp32", "mini_batch_size": 4, "micro_batch_size": 2}
LORA = {"lora_rank": 8, "lora_alpha": 16.0, "seed": 3}
GIB = 2**30


def _save_random_model(path, seed: int) -> None:
    from ragen.models import DEFAULT_MODEL, load_tokenizer, tiny_model

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    tiny_model(hidden_size=1024, num_layers=4, num_heads=8, seed=seed, tokenizer=tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """``a``: the model workers build from; ``b``: another random model of the same shape (a checkpoint to resume);
    ``critic``: a critic folder (``ValueModel.save``) of ``b``'s backbone with a random head."""
    from transformers import AutoModel

    from ragen.models.value_head import ValueModel

    root = tmp_path_factory.mktemp("meta_init")
    out = {name: str(root / name) for name in ("a", "b", "critic")}
    _save_random_model(out["a"], seed=0)
    _save_random_model(out["b"], seed=1)
    torch.manual_seed(5)
    ValueModel(AutoModel.from_pretrained(out["b"]), head_init_std=0.5).save(out["critic"])
    return out


def _full_gb(folder: str) -> float:
    """GiB of one full fp32 copy of the model in ``folder``."""
    import math

    from safetensors import safe_open

    with safe_open(f"{folder}/model.safetensors", "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) * 4 for k in f.keys()) / GIB  # noqa: SIM118


def _plain(folder: str, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def _by_rank(batch, fn, cfg: ActorConfig, autocast: bool = False, world: int = WORLD):
    """``fn`` over each rank's rows in the worker's chunks (``forward_in_chunks``), one result per rank."""
    ids, attn, resp = batch
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    parts = []
    for r in range(world):
        rows = rank_rows(ids.shape[0], r, world)
        with ctx:
            parts.append(forward_in_chunks(TrainBatch(ids[rows], attn[rows], resp[rows]), cfg.micro_batch_size,
                                           torch.device("cpu"), fn))
    return parts


def _plain_log_probs(lm, batch, cfg: ActorConfig, autocast: bool = False, world: int = WORLD) -> torch.Tensor:
    from ragen.workers.logprob import LogProbModel

    model = LogProbModel(lm)
    fn = lambda b: model(b.input_ids, b.attention_mask, target_mask=b.response_mask,  # noqa: E731
                         temperature=cfg.temperature, chunk_size=cfg.log_prob_chunk_size,
                         checkpoint=cfg.checkpoint_lm_head)[0]
    return torch.cat(_by_rank(batch, fn, cfg, autocast, world))


def _equal_states(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def _check_memory(results: list[dict], full_gb: float, load_step: int | None = None) -> None:
    print("peak RSS growth per rank (GiB; build, load):",  # noqa: T201  (the report's numbers, shown with -s)
          [(round(r["rss_build"], 3), round(r[load_step], 3) if load_step is not None else None) for r in results])
    for r, res in enumerate(results):
        assert res["rss_build"] <= full_gb / WORLD + FIXED_GB, (r, res["rss_build"], full_gb)
        if load_step is not None:
            assert res[load_step] <= FIXED_GB, (r, res[load_step], full_gb)


def _batch():
    return random_batch(B=4, T=24, seed=7)


def test_actor_builds_and_resumes_by_slices(folders, tmp_path):
    cfg = ActorConfig(**CFG)
    batch = _batch()
    spec = {"worker": "policy", "model": folders["a"], "cfg": CFG, "batch": batch,
            "steps": [("call", "compute_log_probs"), ("load", folders["b"]), ("call", "compute_log_probs"),
                      ("state", None)]}
    res = run_ranks(spec, tmp_path)
    _check_memory(res, _full_gb(folders["a"]), load_step=1)
    for step, folder in ((0, "a"), (2, "b")):
        lp = torch.cat([r[step] for r in res])
        torch.testing.assert_close(lp, _plain_log_probs(_plain(folders[folder]), batch, cfg), atol=0, rtol=0)
    _equal_states(res[0][3], {f"lm.{k}": v for k, v in _plain(folders["b"]).state_dict().items()})


def test_world_size_one_holds_the_model_once(folders, tmp_path):
    """The unsharded path allocates the model once and reads the file into it: no second copy while loading."""
    cfg = ActorConfig(**CFG)
    batch = _batch()
    spec = {"worker": "policy", "model": folders["a"], "cfg": CFG, "batch": batch,
            "steps": [("call", "compute_log_probs")]}
    (res,) = run_ranks(spec, tmp_path, world_size=1)
    full = _full_gb(folders["a"])
    print("world size 1: peak RSS growth of the build (GiB):", round(res["rss_build"], 3))  # noqa: T201
    assert res["rss_build"] <= full + FIXED_GB, (res["rss_build"], full)
    expected = _plain_log_probs(_plain(folders["a"]), batch, cfg, world=1)
    torch.testing.assert_close(res[0], expected, atol=0, rtol=0)


def test_lora_actor_equals_add_lora_on_the_plain_model(folders, tmp_path):
    from ragen.workers.lora import add_lora

    cfg = ActorConfig(**CFG, **LORA)
    batch = _batch()
    spec = {"worker": "policy", "model": folders["a"], "cfg": {**CFG, **LORA}, "batch": batch,
            "steps": [("call", "compute_log_probs"), ("state", None)]}
    res = run_ranks(spec, tmp_path)
    _check_memory(res, _full_gb(folders["a"]))
    plain = add_lora(_plain(folders["a"]), cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules, seed=cfg.seed)
    expected = {f"lm.{k}": v for k, v in plain.state_dict().items()}
    _equal_states(res[0][1], expected)
    assert any("lora_A" in k and v.abs().sum() > 0 for k, v in expected.items())  # seeded A, drawn, not zero
    lp = torch.cat([r[0] for r in res])
    torch.testing.assert_close(lp, _plain_log_probs(plain, batch, cfg), atol=0, rtol=0)


def test_critic_builds_from_the_lm_and_resumes_a_critic_folder(folders, tmp_path):
    from ragen.models.value_head import ValueModel

    ccfg = dict(CFG)
    batch = _batch()
    spec = {"worker": "critic", "model": folders["a"], "cfg": ccfg, "batch": batch,
            "steps": [("call", "compute_values"), ("load", folders["critic"]), ("call", "compute_values"),
                      ("state", None)]}
    res = run_ranks(spec, tmp_path)
    _check_memory(res, _full_gb(folders["a"]), load_step=1)
    assert all((r[0][0] == 0).all() and (r[0][1] == 0).all() for r in res)  # a zero head: values exactly 0
    plain = ValueModel.load(folders["critic"]).eval()
    expected = _by_rank(batch, lambda b: plain(b.input_ids, b.attention_mask), ActorConfig(**CFG))
    for r in range(WORLD):
        torch.testing.assert_close(res[r][2], expected[r], atol=0, rtol=0)  # (values, last_values)
    assert float(expected[0][0].abs().max()) > 0.1  # the random head makes them informative
    _equal_states(res[0][3], plain.state_dict())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_reference_holds_its_compute_precision(folders, tmp_path, precision):
    """fp32: equal to the plain fp32 model. bf16: bf16 weights (the plain ones rounded), log-probs within
    ``BF16_REF_ATOL`` of the fp32-weight reference under bf16 autocast (how the reference computed before)."""
    cfg = dataclasses.replace(ActorConfig(**CFG), mixed_precision=precision)
    batch = _batch()
    spec = {"worker": "policy", "model": folders["a"], "cfg": {**CFG, "mixed_precision": precision},
            "kwargs": {"role": "ref"}, "batch": batch, "steps": [("call", "compute_log_probs"), ("state", None)]}
    res = run_ranks(spec, tmp_path)
    full = _full_gb(folders["a"])
    _check_memory(res, full / 2 if precision == "bf16" else full)
    lp = torch.cat([r[0] for r in res])
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    plain = _plain(folders["a"])
    expected = {f"lm.{k}": v.to(dtype) for k, v in plain.state_dict().items()}
    _equal_states(res[0][1], expected)
    old_style = _plain_log_probs(plain, batch, cfg, autocast=precision == "bf16")
    resp = batch[2].bool()
    if precision == "fp32":
        torch.testing.assert_close(lp, old_style, atol=0, rtol=0)
    else:
        err = float((lp - old_style)[resp].abs().max())
        print("bf16 reference: max |log-prob - old-style| =", err)  # noqa: T201
        assert 0 < err <= BF16_REF_ATOL, err
