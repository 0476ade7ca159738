"""Keep secrets out of everything a run writes: logs, config dumps, metrics, reports, checkpoints.

A *secret* is the value of an environment variable whose name contains ``KEY``, ``TOKEN``, ``SECRET`` or
``PASSWORD`` (``WANDB_API_KEY``, ``HF_TOKEN``, ``OPENAI_API_KEY``, ``AWS_SECRET_ACCESS_KEY`` ...), when the value has
at least :data:`MIN_SECRET_LEN` characters (so ``TOKENIZERS_PARALLELISM=false`` does not blank every "false" in a
log). :func:`redact` replaces each secret value, wherever it appears in a string, by ``<redacted:NAME>``, and the
string value of any mapping key that names a secret (``api_key: ...``, see :func:`is_secret_key`) by
``<redacted>``. It is applied where the run writes: ``config.json``, the wandb config, metric names, rollout
dumps, evaluation reports and the checkpoint's trainer state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
MIN_SECRET_LEN = 8


def is_secret_name(name: str) -> bool:
    """True when an environment variable or config key named ``name`` holds a secret (case-insensitive)."""
    upper = str(name).upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def is_secret_key(key: str) -> bool:
    """True when a config / record key holds a secret: one of its ``_`` / ``.`` / ``-`` separated words is KEY,
    APIKEY, TOKEN, SECRET, PASSWORD or PASSWD (``api_key``, ``hf_token``; not ``tokenizer_path``)."""
    words = str(key).upper().replace(".", "_").replace("-", "_").split("_")
    return any(w in (*SECRET_NAME_PARTS, "APIKEY", "PASSWD") for w in words)


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{value: NAME}`` of the secret environment variables (longest values first, so a secret that contains
    another is replaced whole)."""
    env = os.environ if environ is None else environ
    found = {v: k for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return dict(sorted(found.items(), key=lambda kv: -len(kv[0])))


def redact_text(text: str, secrets: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret value replaced by ``<redacted:NAME>``."""
    for value, name in (secret_values() if secrets is None else secrets).items():
        if value in text:
            text = text.replace(value, f"<redacted:{name}>")
    return text


def redact(obj: Any, secrets: Mapping[str, str] | None = None) -> Any:
    """A copy of a JSON-like tree (dicts, lists, tuples, strings, numbers) with secrets removed from every string
    (keys included); the non-empty string value of a key whose name looks secret becomes ``<redacted>``. Other
    leaves (numbers, tensors...) are returned as they are."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(obj, str):
        return redact_text(obj, secrets) if secrets else obj
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            key = redact(k, secrets)
            hide = isinstance(k, str) and is_secret_key(k) and isinstance(v, str) and v and not _is_env_name(v)
            out[key] = "<redacted>" if hide else redact(v, secrets)
        return out
    if isinstance(obj, list):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact(v, secrets) for v in obj)
    return obj


def _is_env_name(value: str) -> bool:
    """``OPENAI_API_KEY``-like values name a variable (e.g. ``api_key_env``): they are not secrets themselves."""
    return value.replace("_", "").isalnum() and value.upper() == value
