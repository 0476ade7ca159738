"""Loader: special tokens, chat template, alias cache (atomic, concurrent), hub errors."""

import threading
import time
from pathlib import Path

import pytest
import torch

from ragen.models import DEFAULT_MODEL, load_model, load_tokenizer, loader, resolve_model_path


def test_default_tokenizer_special_tokens(default_tokenizer):
    tok = default_tokenizer
    assert len(tok) == 49152
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 0)
    assert tok.convert_ids_to_tokens(1) == "<|im_start|>"


def test_chat_template_renders_chatml_and_ends_turn_with_eos(default_tokenizer):
    tok = default_tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Pick an arm."}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nPick an arm.<|im_end|>\n<|im_start|>assistant\n")
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    rendered = tok.apply_chat_template(convo, tokenize=False)
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    yo_end = len(tok(rendered[: rendered.index("yo") + 2], add_special_tokens=False)["input_ids"])
    assert ids[yo_end] == tok.eos_token_id  # the template's end-of-turn token is the eos we stop on
    assert loader.end_of_turn_token(tok) == "<|im_end|>"


def test_default_model_config_matches_tokenizer(default_tokenizer):
    model = load_model(dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert model.config.eos_token_id == default_tokenizer.eos_token_id == 2
    assert model.config.pad_token_id == model.generation_config.pad_token_id == default_tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == 2
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert not hasattr(model.config, "quantization_config")


def test_alias_resolves_to_cached_safetensors_folder(monkeypatch):
    path = Path(resolve_model_path(DEFAULT_MODEL))  # converts on the machine's first use
    assert path == loader.default_cache_dir() / DEFAULT_MODEL
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name
    stamps = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    conversions = []
    monkeypatch.setattr(loader, "_convert_gguf", lambda *args: conversions.append(args))
    # later loads are cache hits: no GGUF conversion, the cached files are not rewritten
    assert Path(resolve_model_path(DEFAULT_MODEL)) == path
    tok = load_tokenizer(DEFAULT_MODEL)
    assert tok.eos_token == "<|im_end|>"
    assert conversions == []
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == stamps
    assert not list(path.parent.glob(f".{DEFAULT_MODEL}.tmp-*"))


def test_cache_dir_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path))
    assert loader.default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("RAGEN_CACHE_DIR")
    assert loader.default_cache_dir() == Path.home() / ".cache" / "ragen" / "models"


def _fake_convert(calls):
    def convert(gguf_path, out_dir):
        calls.append(out_dir)
        time.sleep(0.2)  # widen the race window
        (out_dir / "model.safetensors").write_text("w")
        (out_dir / "config.json").write_text("{}")
    return convert


def _race(target, gguf, n=4):
    results, threads = [], []
    for _ in range(n):
        threads.append(threading.Thread(target=lambda: results.append(loader._convert_cached(gguf, target))))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_conversion_converts_once(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_text("x")
    calls = []
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert(calls))
    target = tmp_path / "cache" / "m"
    assert _race(target, gguf) == [target] * 4
    assert len(calls) == 1
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert not list(target.parent.glob(".m.tmp-*"))


def test_unlocked_race_keeps_one_complete_folder(monkeypatch, tmp_path):
    """Without the lock every racer converts; atomic rename keeps the first and the losers discard theirs."""
    import contextlib

    gguf = tmp_path / "m.gguf"
    gguf.write_text("x")
    calls = []
    monkeypatch.setattr(loader, "_convert_gguf", _fake_convert(calls))
    monkeypatch.setattr(loader, "_file_lock", lambda path: contextlib.nullcontext())
    target = tmp_path / "cache" / "m"
    assert _race(target, gguf, n=3) == [target] * 3
    assert len(calls) == 3
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert not list(target.parent.glob(".m.tmp-*"))


def test_unreachable_hub_id_gives_one_clear_error():
    with pytest.raises(OSError) as info:
        resolve_model_path("no-such-org-ragen/no-such-model-ragen")
    message = str(info.value)
    assert "no-such-org-ragen/no-such-model-ragen" in message and DEFAULT_MODEL in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_hub_download_is_one_attempt_with_a_short_timeout(monkeypatch):
    """Offline, a hub id fails after one download attempt whose metadata request times out quickly (instead of
    a wall-clock bound, which is flaky on a loaded machine)."""
    import huggingface_hub

    calls = []

    def unreachable(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        raise ConnectionError("network is unreachable\nsecond line of a long trace")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(OSError) as info:
        resolve_model_path("some-org/some-model")
    assert [repo for repo, _ in calls] == ["some-org/some-model"]
    timeout = calls[0][1].get("etag_timeout")  # huggingface_hub's default is 10 s per metadata request
    assert timeout is not None and 0 < timeout <= 10, calls[0][1]
    message = str(info.value)
    assert "'some-org/some-model'" in message and "ConnectionError: network is unreachable)" in message
    assert "second line" not in message and DEFAULT_MODEL in message


def test_bad_local_path_and_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="neither an alias"):
        resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_local_folder_is_used_as_is():
    path = resolve_model_path(DEFAULT_MODEL)
    assert resolve_model_path(path) == path
