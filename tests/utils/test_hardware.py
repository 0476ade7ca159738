"""ragen.utils.hardware: native-bf16 detection, the RAGEN_NATIVE_BF16 override, and resolving ``auto``."""

import contextlib

import pytest
import torch

from ragen.utils import hardware as H

AVX2_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 fma bmi2
"""
AVX512_BF16_CPUINFO = AVX2_CPUINFO.replace("avx2 fma", "avx2 fma avx512f avx512bw avx512_bf16")
AMX_CPUINFO = AVX2_CPUINFO.replace("avx2 fma", "avx2 fma amx_tile amx_bf16 amx_int8")
ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16\n"


@pytest.fixture(autouse=True)
def _fresh_detection(monkeypatch):
    """No override from the caller's environment, and no cached answer from another test."""
    monkeypatch.delenv(H.ENV_VAR, raising=False)
    H._detect.cache_clear()
    yield
    H._detect.cache_clear()


def test_cpu_flags_parses_the_x86_flags_line():
    assert {"avx2", "fma"} <= H.cpu_flags(AVX2_CPUINFO)
    assert "avx512_bf16" in H.cpu_flags(AVX512_BF16_CPUINFO)
    assert H.cpu_flags(ARM_CPUINFO) is None  # no x86 flags: the probe decides
    assert H.cpu_flags("") is None


@pytest.mark.parametrize(("text", "native", "reason"), [
    (AVX2_CPUINFO, False, "no avx512_bf16/amx_bf16 flag"),
    (AVX512_BF16_CPUINFO, True, "avx512_bf16 flag"),
    (AMX_CPUINFO, True, "amx_bf16 flag"),
])
def test_cpu_support_from_flags(tmp_path, monkeypatch, text, native, reason):
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    monkeypatch.setattr(H, "bf16_matmul_probe", lambda: pytest.fail("flags present: no probe needed"))
    got, why = H._cpu_support(str(info))
    assert got is native and reason in why


@pytest.mark.parametrize("probe", [True, False])
def test_cpu_without_x86_flags_uses_the_probe(tmp_path, monkeypatch, probe):
    info = tmp_path / "cpuinfo"
    info.write_text(ARM_CPUINFO)
    monkeypatch.setattr(H, "bf16_matmul_probe", lambda: probe)
    assert H._cpu_support(str(info))[0] is probe
    assert H._cpu_support(str(tmp_path / "missing"))[0] is probe  # e.g. macOS: no /proc/cpuinfo


def test_probe_runs_fast_and_returns_a_bool():
    assert isinstance(H.bf16_matmul_probe(size=32, repeats=1), bool)


@pytest.mark.parametrize(("value", "native"), [("1", True), ("0", False), ("true", True), ("FALSE", False)])
def test_env_override_wins_on_every_device(monkeypatch, value, native):
    monkeypatch.setenv(H.ENV_VAR, value)
    assert H.native_bf16("cpu") is native and H.native_bf16(torch.device("cuda", 0)) is native
    assert H.bf16_support("cpu")[1] == f"{H.ENV_VAR}={value}"


def test_bad_env_override_names_the_variable(monkeypatch):
    monkeypatch.setenv(H.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match="RAGEN_NATIVE_BF16='maybe' is not understood; set it to 1"):
        H.native_bf16("cpu")


def test_detection_is_cached(monkeypatch):
    calls = []
    monkeypatch.setattr(H, "_cpu_support", lambda: calls.append(1) or (False, "stub"))
    assert [H.native_bf16("cpu") for _ in range(3)] == [False] * 3
    assert len(calls) == 1


@pytest.mark.parametrize(("setting", "dtype"), [("bf16", "bfloat16"), ("fp32", "float32")])
def test_explicit_settings_pass_through(monkeypatch, setting, dtype):
    for forced in ("0", "1"):
        monkeypatch.setenv(H.ENV_VAR, forced)
        assert H.resolve_precision(setting, "cpu") == (setting, f"{setting}: set explicitly")
        assert H.resolve_dtype(dtype, "cpu") == (dtype, f"{dtype}: set explicitly")
    assert H.resolve_dtype("float16", "cpu")[0] == "float16"


def test_auto_is_fp32_without_native_bf16(monkeypatch):
    why = "CPU has no native bf16 (no avx512_bf16/amx_bf16 flag)"
    monkeypatch.setattr(H, "_cpu_support", lambda: (False, why))
    assert H.resolve_precision("auto", "cpu") == ("fp32", f"fp32: {why}")
    assert H.resolve_dtype("auto", "cpu") == ("float32", f"float32: {why}")


def test_auto_is_bf16_with_native_bf16(monkeypatch):
    monkeypatch.setattr(H, "_cpu_support", lambda: (True, "CPU has native bf16 (amx_bf16 flag)"))
    assert H.resolve_precision("auto", torch.device("cpu")) == ("bf16", "bf16: CPU has native bf16 (amx_bf16 flag)")
    assert H.resolve_dtype("auto", "cpu")[0] == "bfloat16"


def test_unknown_settings_name_the_value_and_choices():
    with pytest.raises(ValueError, match=r"mixed_precision='fp16' is unknown; use one of \('auto', 'bf16', 'fp32'\)"):
        H.resolve_precision("fp16", "cpu")
    with pytest.raises(ValueError, match=r"rollout.dtype='bf16' is unknown; use one of \('auto', 'bfloat16'"):
        H.resolve_dtype("bf16", "cpu")


def test_this_machine_matches_its_cpuinfo():
    """The real detection agrees with /proc/cpuinfo's flags (where there are x86 flags)."""
    try:
        flags = H.cpu_flags(open("/proc/cpuinfo").read())
    except OSError:
        flags = None
    if flags is None:
        pytest.skip("no x86 /proc/cpuinfo flags on this machine")
    assert H.native_bf16("cpu") is bool(flags & set(H.CPU_BF16_FLAGS))


@pytest.mark.parametrize(("forced", "autocast"), [("1", True), ("0", False)])
def test_worker_autocast_follows_auto(monkeypatch, forced, autocast):
    """``compute_autocast(device, "auto")`` (what the workers call) autocasts to bf16 only with native bf16."""
    from ragen.workers.dist import compute_autocast

    monkeypatch.setenv(H.ENV_VAR, forced)
    ctx = compute_autocast(torch.device("cpu"), "auto")
    assert isinstance(ctx, torch.autocast) is autocast
    assert isinstance(compute_autocast(torch.device("cpu"), "fp32"), contextlib.nullcontext)
    assert isinstance(compute_autocast(torch.device("cpu"), "bf16"), torch.autocast)
