"""Secrets never reach what a run writes: the redaction rules, then a tiny run grepped file by file."""

from pathlib import Path

import pytest

from ragen.utils.redaction import is_secret_key, is_secret_name, redact, redact_text, secret_values

FAKE = {
    "WANDB_API_KEY": "wk-0123456789abcdef0123456789abcdef",
    "HF_TOKEN": "hf_FakeTokenValue42xyz",
    "DB_PASSWORD": "hunter2hunter2",
    "MY_CLIENT_SECRET": "s3cr3t-v4lue-zz",
}


def test_rules():
    env = {**FAKE, "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin", "SHORT_KEY": "abc"}
    assert secret_values(env) == {v: k for k, v in FAKE.items()}  # short values and other names are ignored
    assert [is_secret_name(n) for n in ("wandb_api_key", "GH_TOKEN", "PASSWORD", "HOME")] == [True] * 3 + [False]
    assert [is_secret_key(k) for k in ("api_key", "hf_token", "tokenizer_path", "max_new_tokens", "apikey")] == [
        True, True, False, False, True]
    secrets = secret_values(env)
    assert redact_text(f"key={FAKE['HF_TOKEN']}!", secrets) == "key=<redacted:HF_TOKEN>!"
    assert redact_text("false stays false", secrets) == "false stays false"
    tree = {"trainer": {"experiment_name": f"x-{FAKE['DB_PASSWORD']}", "n": 3, "lr": 1e-3},
            "rollout": {"api_key": "literal-in-config", "api_key_env": "OPENAI_API_KEY", "tokenizer_path": "/m/tok"},
            f"metric/{FAKE['MY_CLIENT_SECRET']}": [FAKE["WANDB_API_KEY"], (1, FAKE["HF_TOKEN"])]}
    assert redact(tree, secrets) == {
        "trainer": {"experiment_name": "x-<redacted:DB_PASSWORD>", "n": 3, "lr": 1e-3},
        "rollout": {"api_key": "<redacted>", "api_key_env": "OPENAI_API_KEY", "tokenizer_path": "/m/tok"},
        "metric/<redacted:MY_CLIENT_SECRET>": ["<redacted:WANDB_API_KEY>", (1, "<redacted:HF_TOKEN>")]}


@pytest.mark.slow
def test_tiny_run_writes_no_secret(tmp_path, monkeypatch, capfd):
    """A 1-step in-process run whose experiment name embeds a secret: no file it writes (config.json, metrics,
    rollout dumps, checkpoint, plot) and nothing it prints holds any secret value."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
    from trainer_helpers import tiny_overrides

    from ragen.launch import run
    from ragen.trainer.config.compose import load_train_config

    for k, v in FAKE.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "run"
    cfg = load_train_config("ppo_bandit", [*tiny_overrides(out, 1), "trainer.use_ray=false",
                                           "trainer.val_before_train=false",
                                           f"trainer.experiment_name=exp-{FAKE['HF_TOKEN']}"])
    run(cfg)
    files = [p for p in out.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.json", "metrics.jsonl", "trainer_state.pt", "model.safetensors", "COMPLETE"} <= names
    assert any(p.parent.name == "val_rollouts" for p in files)
    for path in files:
        data = path.read_bytes()
        for name, value in FAKE.items():
            assert value.encode() not in data, f"{name} leaked into {path}"
    assert "exp-<redacted:HF_TOKEN>" in (out / "config.json").read_text()
    printed = capfd.readouterr()
    for value in FAKE.values():
        assert value not in printed.out and value not in printed.err
