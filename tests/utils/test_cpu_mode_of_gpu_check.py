"""The GPU check keeps working on CPU-only CI: ``scripts/gpu_check.sh`` without CUDA prints what it would run and
claims nothing, the benchmark commands it would run work in their CPU smoke mode (``--device cpu --tiny``), and the
pure helpers (FLOPs, wheel names, JUnit outcomes, the offline tokenizer folder) give hand-computed answers."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

ROOT = Path(__file__).resolve().parents[2]
NO_DRY_RUN = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: gpu_check.sh would run for real")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


STEPS = ["install", "tests_basic", "tests_runs", "tests_optional", "bench_train", "bench_generate"]
STEP_BUDGET_S = 480  # the device tool's command limit is 10 minutes; a session has 15 device minutes, start included
PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")  # the only file names the device tool returns
MAX_FILES = 8  # the most files the device tool returns from $OUT


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[str, Path, Path]:
    """(stdout, OUT_DIR, WHEEL_DIR) of ``bash scripts/gpu_check.sh WHEEL_DIR OUT_DIR`` on this CPU machine; WHEEL_DIR
    holds an (empty) wheel of a distribution this Python has and one of a distribution it lacks."""
    wheels, out = tmp_path_factory.mktemp("wheels"), tmp_path_factory.mktemp("out")
    (wheels / "PyYAML-6.0.1-cp312-cp312-manylinux_2_17_x86_64.whl").touch()
    (wheels / "no_such_dist-1.0-py3-none-any.whl").touch()
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", str(wheels), str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**_env(), "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, out, wheels


def _env() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _plan(stdout: str) -> dict[str, tuple[int, str]]:
    """``{step: (limit s, command)}`` in the order the dry run printed them."""
    return {name: (int(limit), cmd) for name, limit, cmd in
            re.findall(r"would run \[(\w+), limit (\d+) s\]: (.*)", stdout)}


def _header_table() -> dict[str, tuple[int, int | None]]:
    """``{step: (limit s, per-test timeout s or None)}`` from the table in gpu_check.sh's header comment."""
    header = (ROOT / "scripts" / "gpu_check.sh").read_text().split("\nset -")[0]
    return {name: (int(limit), None if per_test == "-" else int(per_test.split()[0])) for name, limit, per_test in
            re.findall(r"^#   (\w+) +(\d+) s +(\d+ s|-) ", header, flags=re.M)}


@NO_DRY_RUN
def test_without_cuda_it_prints_what_it_would_run_and_claims_nothing(dry_run):
    stdout, out, wheels = dry_run
    assert "no CUDA device" in stdout
    assert f"install\t{wheels / 'no_such_dist-1.0-py3-none-any.whl'}" in stdout
    assert re.search(r"skip\t\S+PyYAML\S+\tpyyaml \S+ is installed", stdout)  # the machine's own version wins
    assert list(_plan(stdout)) == STEPS
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_check.json", "steps.tsv"]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["cuda"] is False and report["tests"] == {} and report["figures"] == {}
    assert {k: v["status"] for k, v in report["steps"].items()} == dict.fromkeys(STEPS, "not run (no CUDA)")
    for path in out.iterdir():  # nothing written claims a pass
        assert "passed" not in path.read_text().lower(), path


@NO_DRY_RUN
def test_step_limits_fit_the_device_budget_and_each_test_times_out_inside_its_step(dry_run):
    stdout, _, _ = dry_run
    plan = _plan(stdout)
    assert sum(limit for limit, _ in plan.values()) <= STEP_BUDGET_S  # install included
    per_test = {}
    for name, (limit, cmd) in plan.items():
        if " -m pytest " in cmd:
            timeout = int(re.search(r"--timeout=(\d+)", cmd).group(1))
            assert timeout < limit, f"{name}: a test may run {timeout} s, the step only {limit} s"
            per_test[name] = timeout
    assert list(per_test) == ["tests_basic", "tests_runs", "tests_optional"]
    # the header comment says what the script does
    assert _header_table() == {name: (limit, per_test.get(name)) for name, (limit, _) in plan.items()}


@NO_DRY_RUN
def test_the_tests_run_most_basic_first_and_cover_every_gpu_test(dry_run):
    stdout, _, _ = dry_run
    ordered = [nid for name, (_, cmd) in _plan(stdout).items() if " -m pytest " in cmd
               for nid in shlex.split(cmd) if "::" in nid]
    names = [nid.split("::")[1] for nid in ordered]
    assert names == [  # the FSDP2 update under NCCL, log-probs, the engine, the colocated run, resume, then extras
        "test_fsdp2_update_on_one_rank_equals_the_cpu_update_in_fp32",
        "test_fsdp2_bf16_update_stays_within_bounds_of_fp32",
        "test_log_probs_and_values_on_the_device_equal_a_cpu_reference",
        "test_kv_reuse_across_turns_gives_the_greedy_rollouts_of_full_prefills",
        "test_sleep_frees_the_engine_memory_and_wake_restores_it",
        "test_hf_engine_wakes_its_weights_for_the_weights_tag_only",
        "test_offload_frees_the_training_state_while_the_engine_generates",
        "test_phase_memory_reads_the_peaks_of_the_memory_the_process_uses",
        "test_multi_turn_run_colocated_on_one_device",
        "test_resume_after_a_kill_equals_an_unbroken_run",
        "test_multi_turn_run_with_ray_workers_on_one_gpu",
        "test_run_logs_to_wandb_offline",
        "test_varlen_attention_matches_sdpa_in_bf16",
    ]
    # every test marked gpu in tests/*/test_gpu_*.py is in the plan, once
    gpu_files = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/*/test_gpu_*.py"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
                           "no:cacheprovider", *gpu_files], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=_env())
    collected = {line.split("[")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert len(ordered) == len(set(ordered)) and set(ordered) == collected, proc.stdout[-2000:]


@NO_DRY_RUN
def test_require_cuda_without_cuda_fails_saying_why(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--require-cuda", str(tmp_path), str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**_env(), "PYTHON": sys.executable})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "--require-cuda was given and this machine has no CUDA device" in proc.stdout
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["cuda"] is False and set(report["steps"]) == set(STEPS)


def _smoke(stdout: str, name: str, tmp_path: Path) -> dict:
    """Run the benchmark command the dry run printed for step ``name`` in its CPU smoke mode; its figures (also
    written to ``tmp_path/<name>.json``)."""
    cmd = shlex.split(re.search(rf"would run \[{name}, limit \d+ s\]: (.*)", stdout).group(1))
    out = tmp_path / f"{name}.json"
    cmd[cmd.index("--out") + 1] = str(out)
    proc = subprocess.run([*cmd, "--device", "cpu", "--tiny"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@NO_DRY_RUN
def test_the_benchmarks_it_would_run_work_in_cpu_smoke_mode(dry_run, tmp_path):
    stdout, _, _ = dry_run
    train = _smoke(stdout, "bench_train", tmp_path)  # bench_train.json, as gpu_check.sh names it
    assert train["tiny"] is True and train["device"] == "cpu" and list(train["shapes"]) == ["tiny"]
    tiny = train["shapes"]["tiny"]
    for key in ("ours_tokens_per_s", "bare_tokens_per_s", "ratio", "mfu_vs_measured"):
        assert math.isfinite(tiny[key]) and tiny[key] > 0, key
    assert tiny["ours_tokens_per_s"] == pytest.approx(4 * 64 / tiny["ours_update_s"])
    assert tiny["mfu_vs_spec"] is None and train["peak"]["spec_tflops"] is None  # no spec for a CPU
    assert set(tiny["peak_memory_gib"]) == {"init", "old_log_probs", "actor_update", "bare_update"}
    gen = _smoke(stdout, "bench_generate", tmp_path)
    assert gen["all_rows_full_length"] and gen["ratio"] > 0 and gen["sleep_wake_gib"] is None
    assert gen["rows_equal_to_bare"] == 1.0  # fp32 greedy: our decode loop picks what transformers' generate picks
    # the summary a CUDA run ends with, over these figures, a tests step and its JUnit file
    (tmp_path / "steps.tsv").write_text("install\tpassed\t9\ntests_basic\tpassed\t50\n")
    (tmp_path / "tests.tsv").write_text("t::a[cuda]\tstarted\nt::a[cuda]\tpassed\t3.0\n"
                                        "t::ray\tstarted\nt::ray\tskipped (missing ray)\t0.0\n")
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "summary", str(tmp_path), "--cuda", "1",
                           "--command", "bash scripts/gpu_check.sh w o"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["steps"]["tests_basic"] == {"status": "passed", "seconds": 50.0}
    assert report["tests"] == {"t::a[cuda]": "passed", "t::ray": "skipped (missing ray)"}
    assert report["test_counts"] == {"passed": 1, "skipped": 1}
    assert report["figures"]["train"]["shapes"]["tiny"]["ratio"] == tiny["ratio"]
    assert "train tiny: 4 x 64 tokens" in proc.stdout and "generate tiny float32" in proc.stdout


def test_train_flops_hand_computed():
    bench = _load("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    # 6 N tokens = 6 * 10 * (5 * 6) = 1800; causal attention 6 L H Q T per token = 6 * 2 * 3 * 4 * 6 * 30 = 25920
    assert bench.train_flops(10, layers=2, heads=3, head_dim=4, rows=5, seq_len=6) == 1800 + 25920


@pytest.mark.parametrize("tied", [True, False])
def test_matmul_params_count_the_output_projection_once(tied):
    bench = _load("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    cfg = LlamaConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=tied)
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate, up, down 8x16 each = 64 + 32 + 32 + 64 + 3 * 128 = 576;
    # two layers 1152, plus the lm_head 100 x 8 = 800; the embedding lookup is not a matmul
    assert bench.matmul_params(LlamaForCausalLM(cfg)) == 1152 + 800


def test_wheel_names_and_live_log_outcomes():
    helper = _load("gpu_check_helper", ROOT / "scripts" / "gpu_check.py")
    assert helper.wheel_dist("hydra_core-1.3.2-py3-none-any.whl") == "hydra-core"
    assert helper.wheel_dist("PyYAML-6.0.1-1-cp312-cp312-manylinux_2_17_x86_64.whl") == "pyyaml"
    assert helper.assumed_present("nvidia_cublas_cu12") and helper.assumed_present("Typing_Extensions")
    assert helper.assumed_present("requests") and helper.assumed_present("pytest_timeout")  # on the GPU image
    assert not any(helper.assumed_present(d) for d in ("ray", "wandb", "hydra-core", "omegaconf", "gymnasium"))
    with pytest.raises(ValueError, match="not a wheel"):
        helper.wheel_dist("antlr4-python3-runtime-4.9.3.tar.gz")
    log = "\n".join([
        "a::ok[cuda]\tstarted", "a::ok[cuda]\tpassed\t1.5",
        "a::bad[cuda]\tstarted", "a::bad[cuda]\tfailed (assert 1 == 2)\t0.2",
        # passed its call, then its teardown failed: failed
        "a::td[cuda]\tstarted", "a::td[cuda]\tpassed\t0.1", "a::td[cuda]\tfailed (leaked a process)\t0.0",
        "b::ray\tstarted", "b::ray\tskipped (missing ray)\t0.0",
        "b::hung[cuda]\tstarted",  # its step was stopped before it ended
    ])
    assert helper.live_log_outcomes(log) == {
        "a::ok[cuda]": "passed", "a::bad[cuda]": "failed (assert 1 == 2)", "a::td[cuda]": "failed (leaked a process)",
        "b::ray": "skipped (missing ray)", "b::hung[cuda]": "did not finish"}


def test_exported_tokenizer_loads_without_the_packaged_model(tmp_path, monkeypatch):
    from ragen.models import export_tokenizer, load_tokenizer, loader

    reference = load_tokenizer()
    folder = export_tokenizer(tmp_path / "tok")
    assert (folder / "config.json").is_file() and not list(folder.glob("*.safetensors"))  # no weights travel

    def refuse(package, alias):
        raise FileNotFoundError(alias)

    monkeypatch.setattr(loader, "_package_dir", refuse)
    with pytest.raises(FileNotFoundError):
        load_tokenizer()
    tok = load_tokenizer(str(folder))
    messages = [{"role": "user", "content": "Go left twice."}, {"role": "assistant", "content": "<answer>Left"}]
    assert tok.apply_chat_template(messages, tokenize=False) == reference.apply_chat_template(messages,
                                                                                                tokenize=False)
    assert tok("Left || Right")["input_ids"] == reference("Left || Right")["input_ids"]
    assert (tok.eos_token, tok.pad_token, len(tok)) == (reference.eos_token, reference.pad_token, len(reference))
