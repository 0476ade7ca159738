"""``--check`` on GPU configs planned from this CPU machine: the memory plan per GPU for the documented Qwen2.5-7B
commands (figures by hand), and what would fail at start-up on the GPUs refused before anything starts: a plan that
cannot fit one GPU, vLLM not installed, a tensor-parallel size that does not split the heads, a tokenizer that is
not the model's. Models are weightless stand-ins with the published Qwen2.5 config.json (``standins``)."""

from __future__ import annotations

import importlib.util
import re
import shutil

import pytest
from doc_commands import documented_commands
from standins import DATA
from test_documented_commands import StandIns, entry, run_in_process

GIB = 2**30
P = 7_615_616_512  # Qwen2.5-7B: 2 x 152064 x 3584 + 3584 + 28 x 233,057,792 (tests/models/test_shape.py)
ROOT = 2 * 152064 * 3584 + 3584  # embedding, output head, final norm
LAYER = 233_057_792
CRITIC = P - 152064 * 3584 + 3584 + 1  # the backbone (no output head) and Linear(3584, 1)
DOC_7B = ("bash", "scripts/train_search_qa.sh", "ms_grpo", "trainer=gpu", "model.path=Qwen/Qwen2.5-7B-Instruct")
PPO_7B = ("bash", "train_ppo.sh", "trainer=gpu", "model.path=Qwen/Qwen2.5-7B-Instruct")
# per token and layer, bf16 (FSDP2): 1.3 x (13 x 3584 + 4 x 18944) x 2 B recomputed, 6 x 3584 x 2 B checkpointed
LAYER_ACT, KEPT = 1.3 * (13 * 3584 + 4 * 18944) * 2, 6 * 3584 * 2
NO_GRAD = (4 * 3584 + 3 * 18944) * 2 + 4 * 3584  # a no-grad pass's working set and fp32 hidden states per token


def _check(argv, tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir, *extra: str) -> tuple[int, str, str]:
    """The documented command ``argv`` (+ ``extra`` overrides) as the console runs it, with ``--check``."""
    module, args = entry(argv)
    args = StandIns(tmp_path, tokenizer_dir, None, qwen_tokenizer_dir).args(module, [*args, *extra])
    status = run_in_process(module, [*args, f"trainer.output_dir={tmp_path / 'run'}"])
    out, err = capsys.readouterr()
    return status, out, err


def _figure(out: str, name: str) -> float:
    found = re.search(rf"^\[ragen\]   {re.escape(name)} +([\d.]+) GiB", out, re.M)
    assert found, f"no plan line {name!r} in:\n{out}"
    return float(found.group(1))


def _phases(out: str) -> dict[str, float]:
    line = re.search(r"per phase \(GiB\): (.*?); peak", out).group(1)
    return {k: float(v) for k, v in (part.rsplit(" ", 1) for part in line.split(", "))}


def _assert_figures(out: str, expect: dict[str, float]) -> None:
    for name, value in expect.items():
        assert _figure(out, name) == pytest.approx(value / GIB, abs=0.006), name


def test_the_documented_7b_command_prints_its_memory_plan(tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir):
    """docs/training.md's ``bash scripts/train_search_qa.sh ms_grpo trainer=gpu model.path=Qwen/Qwen2.5-7B-Instruct``
    on 8 GPUs of an assumed 80 GiB: 7.62B params over 8 ranks; micro-batches of 6 rows x 4096 tokens with gradient
    checkpointing; log-prob chunks of 1024 tokens x vocab 152064; vLLM at 0.5 of the GPU, asleep in training."""
    assert DOC_7B in {c.argv for c in documented_commands()}
    status, out, err = _check(DOC_7B, tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir)
    assert status == 0, err
    tokens = 6 * 4096
    expect = {
        "actor weights": 4 * P / 8, "actor AdamW moments": 8 * P / 8, "actor gradients": 4 * P / 8,
        "actor gathered weights": (ROOT + 2 * LAYER) * 2 * 2,
        "actor activations": tokens * (28 * KEPT + LAYER_ACT),
        "actor logits": 1024 * 152064 * 24,
        "largest no-grad pass": tokens * NO_GRAD + (ROOT + 2 * LAYER) * 2 + 1024 * 152064 * 18,
        "CUDA contexts": 0.5 * GIB, "vllm engine": 40 * GIB, "vllm engine asleep": 1 * GIB,
    }
    _assert_figures(out, expect)
    g = {k: v / GIB for k, v in expect.items()}
    resident = g["actor weights"] + g["actor AdamW moments"] + g["CUDA contexts"]
    update = resident + 1 + sum(g[f"actor {n}"] for n in ("gradients", "gathered weights", "activations", "logits"))
    assert _phases(out) == pytest.approx({"rollout": resident + 40, "log-prob passes": resident + 1
                                          + g["largest no-grad pass"], "actor update": update}, abs=0.006)
    assert f"peak {update:.2f} GiB (actor update) = {100 * update / 80:.0f}% of 80 GiB: fits" in out  # 59.81
    assert "a GPU of 80 GiB (ASSUMED: no GPU is visible here; set trainer.gpu_memory_gb" in out
    # vLLM's budget: 40 GiB - 2 B x P of weights - 2 GiB, at 2 x 28 layers x 4 heads x 128 x 2 B = 56 KiB per token
    kv_tokens = int((40 - 2 * P / GIB - 2) * GIB // (2 * 28 * 4 * 128 * 2))
    assert f"KV cache 23.81 = {kv_tokens} tokens ({kv_tokens // 4096} sequences of 4096)" in out


def test_the_8_gpu_ppo_7b_command_plans_actor_and_critic(tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir):
    """``bash train_ppo.sh trainer=gpu model.path=Qwen/Qwen2.5-7B-Instruct``: RAGEN's recipe, GAE with a critic of
    its own, mini-batches of 32 over 8 ranks = micro-batches of 4 rows x 3600 tokens, both checkpointed."""
    status, out, err = _check(PPO_7B, tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir)
    assert status == 0, err
    tokens = 4 * 3600
    critic_root = 152064 * 3584 + 3584
    expect = {
        "actor weights": 4 * P / 8, "actor AdamW moments": 8 * P / 8,
        "actor activations": tokens * (28 * KEPT + LAYER_ACT), "critic weights": 4 * CRITIC / 8,
        "critic AdamW moments": 8 * CRITIC / 8, "critic gradients": 4 * CRITIC / 8,
        "critic gathered weights": (critic_root + 2 * LAYER) * 2 * 2,
        "critic activations": tokens * (28 * KEPT + LAYER_ACT),
        "largest no-grad pass": tokens * NO_GRAD + (ROOT + 2 * LAYER) * 2 + 1024 * 152064 * 18,  # the actor's
        "CUDA contexts": 2 * 0.5 * GIB,
    }
    _assert_figures(out, expect)
    assert "GPU 0 holds rank 0 of actor, critic and the vllm engine" in out
    resident = (4 * P / 8 + 8 * P / 8 + 4 * CRITIC / 8 + 8 * CRITIC / 8) / GIB + 1.0
    phases = _phases(out)
    assert phases["rollout"] == pytest.approx(resident + 40, abs=0.006)
    assert phases["critic update"] == pytest.approx(
        resident + 1 + (4 * CRITIC / 8 + (critic_root + 2 * LAYER) * 4 + tokens * (28 * KEPT + LAYER_ACT)) / GIB,
        abs=0.006)
    assert f"peak {resident + 40:.2f} GiB (rollout)" in out and ": fits" in out


def test_7b_on_one_16_gb_gpu_is_refused_naming_what_lowers_it(tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir):
    """One 16 GiB GPU cannot hold a full fine-tune of 7.62B params (16 bytes each in fp32 weights, gradients and
    AdamW state: 113 GiB), nor vLLM's weights in half of it; trainer.memory_check=warn starts it anyway."""
    one = ("trainer.n_gpus_per_node=1", "trainer.gpu_memory_gb=16")
    status, _, err = _check(DOC_7B, tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir, *one)
    assert status == 2
    assert "memory plan: GPU 0 needs" in err and "more than a GPU of 16 GiB (trainer.gpu_memory_gb=16)" in err
    for knob in ("a smaller actor.micro_batch_size (now 6)", "a lower agent.max_model_len (now 4096)",
                 "more GPUs (trainer.n_gpus_per_node=1 x trainer.nnodes=1, world size 1)", "actor.lora_rank=16",
                 "a lower rollout.vllm.gpu_memory_utilization (now 0.5)", "trainer.memory_check=warn starts it anyway"):
        assert knob in err, knob
    assert ("rollout.vllm.gpu_memory_utilization=0.5 x 16 GiB = 8.00 GiB, leaves KV cache for 0 tokens after its "
            "weights (14.19 GiB") in err
    status, out, err = _check(DOC_7B, tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir, *one,
                              "trainer.memory_check=warn")
    assert status == 0, err
    assert _figure(out, "actor AdamW moments") == pytest.approx(8 * P / GIB, abs=0.006)
    assert "of 16 GiB: DOES NOT FIT" in out and "trainer.memory_check=warn: the run starts anyway" in out


@pytest.fixture
def no_vllm(monkeypatch):
    """vllm is not importable (as in this environment; the vLLM environment has it)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


VLLM_GPU = ("ragen", "train", "--config-name", "ppo_bandit", "trainer=gpu")


def test_vllm_missing_on_a_gpu_machine_is_refused(tmp_path, capsys, monkeypatch, tokenizer_dir, no_vllm):
    """trainer=gpu samples with vLLM: on a machine that sees CUDA (the one that would start the run) a missing vllm
    fails the check naming the install."""

    from ragen.trainer.config import shared_checks

    monkeypatch.setattr(shared_checks, "_cuda_visible", lambda: True, raising=False)
    status, _, err = _check(VLLM_GPU, tmp_path, capsys, tokenizer_dir, None)
    assert status == 2
    assert "rollout.engine=vllm (trainer=gpu) needs vLLM, which is not installed in this environment: pip install " \
           "-e .[gpu] (vllm==0.32.0" in err


def test_vllm_missing_where_the_run_is_planned_is_said(tmp_path, capsys, tokenizer_dir, no_vllm):
    """Planned from a machine without GPUs the check passes and the plan says what the GPU machines need."""
    status, out, err = _check(VLLM_GPU, tmp_path, capsys, tokenizer_dir, None)
    assert status == 0, err
    assert "vllm is not installed here: the GPU machines need pip install -e .[gpu] (vllm==0.32.0)" in out


def test_tensor_parallel_size_that_does_not_split_the_heads_is_refused(tmp_path, capsys, tokenizer_dir,
                                                                       qwen_tokenizer_dir):
    """Qwen2.5-7B has 28 query and 4 key/value heads: 3 GPUs split neither; on 8 GPUs 1, 2 and 4 do (7 splits the
    queries, but 4 key/value heads cannot be spread over 7). An engine spans GPUs in the separate placement (a
    colocated engine is one per actor rank, tensor parallel size 1)."""
    argv = ("ragen", "train", "--config-name", "ppo_bandit", "trainer=gpu", "model.path=Qwen/Qwen2.5-7B-Instruct",
            "rollout.vllm.placement=separate")
    status, _, err = _check(argv, tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir,
                            "rollout.vllm.tensor_parallel_size=3", "rollout.vllm.rollout_gpus=3",
                            "trainer.n_gpus_per_node=7")  # 4 training GPUs divide the mini-batches
    assert status == 2
    assert ("rollout.vllm.tensor_parallel_size=3 does not split the model's 28 attention heads and 4 key/value heads "
            "evenly over 3 GPUs, so vLLM would refuse to start; use one of [1, 2, 4]") in err
    status, out, err = _check(argv, tmp_path, capsys, tokenizer_dir, qwen_tokenizer_dir,
                              "rollout.vllm.tensor_parallel_size=4", "rollout.vllm.rollout_gpus=4")
    assert status == 0, err
    assert "weights 3.55 (/ tensor_parallel_size 4)" in out  # 2 B x 7.62B / 4 GPUs


def test_a_tokenizer_of_another_model_is_refused(tmp_path, capsys, tokenizer_dir):
    """The default tokenizer (SmolLM2, 49152 tokens) beside Qwen2.5-7B's config: every id fits the 152064-row
    embedding, but the config's bos / eos ids 151643 / 151645 are no tokens of it. The Qwen-sized tokenizer (151660
    tokens, padded embedding) passes: the plans above run with it."""
    folder = tmp_path / "qwen-with-smollm-tokenizer"
    shutil.copytree(tokenizer_dir, folder)
    shutil.copy(DATA / "Qwen2.5-7B-Instruct" / "config.json", folder / "config.json")
    status = run_in_process("ragen.train", ["--config-name", "ppo_bandit", f"model.path={folder}",
                                            f"trainer.output_dir={tmp_path / 'run'}"])  # no stand-in for this folder
    err = capsys.readouterr().err
    assert status == 2
    assert "model.path's config has eos_token_id=151645, but id 151645 is no special token of the tokenizer" in err
    assert "49152 tokens): the tokenizer does not belong to the model" in err
    assert "bos_token_id=151643" in err and "use the model's own tokenizer (model.tokenizer_path" in err


def test_tokenizer_problems_by_size(tokenizer_dir, qwen_tokenizer_dir):
    """More tokens than embedding rows is refused; fewer (a padded embedding) is not."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from ragen.models.loader import fix_special_tokens, load_tokenizer
    from ragen.trainer.config.resource_checks import tokenizer_problems

    qwen = fix_special_tokens(AutoTokenizer.from_pretrained(qwen_tokenizer_dir))
    config = SimpleNamespace(vocab_size=152064, bos_token_id=151643, eos_token_id=[151645, 151643])
    assert len(qwen) == 151660 and tokenizer_problems(config, qwen, "model.path") == []
    small = SimpleNamespace(vocab_size=151000, bos_token_id=None, eos_token_id=None)
    problems = tokenizer_problems(small, qwen, "model.path")
    assert problems[0].startswith("the tokenizer has 151660 tokens but model.path's vocab_size is 151000")
    assert "end-of-turn token '<|im_end|>' (id 151645) is not below model.path's vocab_size 151000" in problems[1]
    default = load_tokenizer(tokenizer_dir)  # with its own model's config
    assert tokenizer_problems(SimpleNamespace(vocab_size=49152, bos_token_id=1, eos_token_id=2), default,
                              "model.path") == []
