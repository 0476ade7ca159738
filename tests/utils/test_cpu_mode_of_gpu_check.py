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

ROOT = Path(__file__).resolve().parents[2]
NO_DRY_RUN = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: gpu_check.sh would run for real")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


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


@NO_DRY_RUN
def test_without_cuda_it_prints_what_it_would_run_and_claims_nothing(dry_run):
    stdout, out, wheels = dry_run
    assert "no CUDA device" in stdout
    assert f"install\t{wheels / 'no_such_dist-1.0-py3-none-any.whl'}" in stdout
    assert re.search(r"skip\t\S+PyYAML\S+\tpyyaml \S+ is installed", stdout)  # the machine's own version wins
    runs = dict(re.findall(r"would run \[(\w+), limit (\d+) s\]", stdout))
    assert list(runs) == ["tests", "bench_train", "bench_generate"]
    install = int(re.search(r"install \[limit (\d+) s\]", stdout).group(1))
    assert install + sum(int(v) for v in runs.values()) <= 600  # the whole check fits in 10 minutes
    tests_cmd = re.search(r"would run \[tests, limit \d+ s\]: (.*)", stdout).group(1)
    gpu_files = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/*/test_gpu_*.py"))
    assert "-m gpu" in tests_cmd and gpu_files and all(f in tests_cmd for f in gpu_files)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "steps.tsv"]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["cuda"] is False and report["tests"] == {} and report["figures"] == {}
    assert {k: v["status"] for k, v in report["steps"].items()} == dict.fromkeys(
        ["install", "tests", "bench_train", "bench_generate"], "not run (no CUDA)")
    for path in out.iterdir():  # nothing written claims a pass
        assert "passed" not in path.read_text().lower(), path


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
    (tmp_path / "steps.tsv").write_text("install\tpassed\t9\ntests\tpassed\t120\n")
    (tmp_path / "tests.xml").write_text('<testsuite><testcase classname="t" name="a[cuda]"/><testcase '
                                        'classname="t" name="ray"><skipped message="missing ray"/></testcase>'
                                        '</testsuite>')
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "summary", str(tmp_path), "--cuda", "1",
                           "--command", "bash scripts/gpu_check.sh w o"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["steps"]["tests"]["status"] == "passed (1 passed, 1 skipped)"
    assert report["tests"] == {"t::a[cuda]": "passed", "t::ray": "skipped (missing ray)"}
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


def test_wheel_names_and_junit_outcomes():
    helper = _load("gpu_check_helper", ROOT / "scripts" / "gpu_check.py")
    assert helper.wheel_dist("hydra_core-1.3.2-py3-none-any.whl") == "hydra-core"
    assert helper.wheel_dist("PyYAML-6.0.1-1-cp312-cp312-manylinux_2_17_x86_64.whl") == "pyyaml"
    assert helper.assumed_present("nvidia_cublas_cu12") and helper.assumed_present("Typing_Extensions")
    assert not helper.assumed_present("ray") and not helper.assumed_present("requests")
    with pytest.raises(ValueError, match="not a wheel"):
        helper.wheel_dist("antlr4-python3-runtime-4.9.3.tar.gz")
    xml = """<testsuites><testsuite>
      <testcase classname="tests.a" name="t_ok[cuda]"/>
      <testcase classname="tests.a" name="t_bad[cuda]"><failure message="assert 1 == 2"/></testcase>
      <testcase classname="tests.a" name="t_err[cuda]"><error message="fixture"/></testcase>
      <testcase classname="tests.b" name="t_ray"><skipped type="pytest.skip" message="missing ray"/></testcase>
      <testcase classname="tests.b" name="t_wandb"><skipped message="Skipped: missing wandb"/></testcase>
    </testsuite></testsuites>"""
    assert helper.junit_outcomes(xml) == {
        "tests.a::t_ok[cuda]": "passed", "tests.a::t_bad[cuda]": "failed", "tests.a::t_err[cuda]": "failed",
        "tests.b::t_ray": "skipped (missing ray)", "tests.b::t_wandb": "skipped (missing wandb)"}


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
