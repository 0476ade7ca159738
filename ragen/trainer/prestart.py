"""Checks between validation and the first write: the model loads, the output folder is free, the envs build.

``ragen.launch.validate`` checks the config's values; these checks read what the config points at, still before
the run folder, ``config.json``, Ray or any worker exists, so a wrong model path or a reused output folder costs
seconds and prints one line per problem (``ConfigError``), never a traceback:

* the model (``model.path``, or only the tokenizer with ``model.tiny=true``; ``critic.model_path`` when set): its
  transformers config and tokenizer load (``ragen.models.inspect_model``; a dry run reads no weights);
* ``trainer.resume`` given as a path names a complete checkpoint;
* the output folder: a run saved there (``<trainer.output_dir>/config.json``) with another config is refused,
  naming each differing key with its old and new value, unless ``trainer.resume=force``; the keys in
  :data:`RESUME_KEYS` may differ, since a continued run changes them (more steps, other logging);
* each env of the run builds and resets (dry run; a missing optional package names its extra).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen.trainer.config import ConfigError, TrainConfig

# Keys a continued run may change: its length, resume mode, logging, progress, reporting, fault handling and
# where the workers run (Ray or in-process, its cluster and placement) and their state waits between phases, none of
# which changes what the steps compute. Every other key must equal the saved run's.
RESUME_KEYS = frozenset({
    "trainer.total_steps", "trainer.resume", "trainer.val_only", "trainer.dry_run", "trainer.output_dir",
    "trainer.verbose", "trainer.progress_bar", "trainer.loggers", "trainer.project_name", "trainer.experiment_name",
    "trainer.save_freq", "trainer.val_freq", "trainer.keep_last_ckpt", "trainer.report",
    "trainer.report_train_samples", "trainer.report_val_samples", "trainer.max_restarts",
    "trainer.max_consecutive_skips", "trainer.worker_call_timeout_s", "trainer.worker_start_timeout_s",
    "trainer.placement_timeout_s", "trainer.ray_address", "trainer.num_threads", "trainer.cpus_per_worker",
    "trainer.use_ray", "trainer.placement_strategy", "trainer.offload", "model.cache_dir",
})
SHOWN_DIFFERENCES = 6  # differing keys named in the message (the rest are counted)


@dataclass(frozen=True)
class ModelCheck:
    """What the model check found: ``summary`` (architecture, sizes, parameters) and ``tokenizer`` (class,
    vocabulary, special tokens) for the plan."""

    summary: str
    tokenizer: str


def check_before_start(cfg: TrainConfig, *, dry_run: bool = False) -> ModelCheck:
    """Run every check of this module (envs only when ``dry_run``; a real run converts or downloads the model's
    weights here, as its start would); raises one ``ConfigError`` listing every problem."""
    problems = run_dir_problems(cfg) + resume_problems(cfg)
    model, model_problems = _model_check(cfg, convert=not dry_run)
    problems += model_problems
    if dry_run:
        problems += env_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return model


def _model_check(cfg: TrainConfig, convert: bool) -> tuple[ModelCheck, list[str]]:
    """The model's config and tokenizer (only the tokenizer with ``model.tiny``), and ``critic.model_path``'s;
    ``convert``: resolve ``model.path`` to its weights folder first (conversion / download, cached)."""
    from ragen.models.loader import inspect_model, resolve_model_path

    m, problems = cfg.model, []

    def load(key: str, value: str, weights: bool = False, tokenizer: bool = True) -> tuple[Any, Any]:
        try:
            folder = resolve_model_path(value, m.cache_dir) if weights else value
            return inspect_model(folder, m.cache_dir, tokenizer=tokenizer)
        except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line naming the key
            problems.append(f"{key}={value!r} cannot be loaded: {_reason(exc)}")
            return None, None

    own_tokenizer = not (m.tokenizer_path or m.tiny)  # else the tokenizer comes from model.tokenizer_path
    config, tokenizer = (None, None) if m.tiny else load("model.path", m.path, convert, own_tokenizer)
    if not own_tokenizer:
        tokenizer = load("model.tokenizer_path" if m.tokenizer_path else "model.path", m.tokenizer_path or m.path)[1]
    if cfg.critic.model_path:
        load("critic.model_path", cfg.critic.model_path, tokenizer=False)
    if problems:
        return ModelCheck("", ""), problems
    summary = (f"tiny random Llama (hidden {m.tiny_hidden_size}, {m.tiny_num_layers} layers, {m.tiny_num_heads} "
               "heads)") if m.tiny else model_summary(config)
    return ModelCheck(summary, tokenizer_summary(tokenizer)), []


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, (ValueError, OSError)) and text else f"{type(exc).__name__}: {text}"


def model_summary(config: Any) -> str:
    """One line: architecture, layers, hidden size, heads, vocabulary and an estimate of the parameter count."""
    arch = (getattr(config, "architectures", None) or [getattr(config, "model_type", "?")])[0]
    layers, hidden = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    parts = [str(arch)]
    if layers and hidden and heads:
        parts.append(f"{layers} layers, hidden {hidden}, {heads} heads ({kv} key/value)")
    parts.append(f"vocab {getattr(config, 'vocab_size', '?')}")
    params = parameter_estimate(config)
    if params:
        parts.append(f"~{params / 1e9:.2f}B parameters")
    return ", ".join(parts)


def parameter_estimate(config: Any) -> int | None:
    """Parameters of a decoder-only transformer from its config (attention with grouped key/value heads, a gated
    MLP of three matrices, the embedding, and an output head unless tied); norms and biases are left out (<0.1%).
    None when the config lacks a size."""
    try:
        h, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
        inter, vocab = config.intermediate_size, config.vocab_size
    except AttributeError:
        return None
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return layers * (attention + 3 * h * inter) + vocab * h * (1 if tied else 2)


def tokenizer_summary(tokenizer: Any) -> str:
    chat = "chat template" if getattr(tokenizer, "chat_template", None) else "NO chat template"
    return (f"{type(tokenizer).__name__}, {len(tokenizer)} tokens, eos {tokenizer.eos_token!r}, pad "
            f"{tokenizer.pad_token!r}, {chat}")


def saved_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The config a run folder was started with (its ``config.json``), or None when there is none."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_dir_problems(cfg: TrainConfig) -> list[str]:
    """[] when ``trainer.output_dir`` holds no run, or one whose saved config equals ``cfg`` outside
    :data:`RESUME_KEYS`, or with ``trainer.resume=force``; else one problem naming the differing keys and the fix."""
    old = saved_config(cfg.trainer.output_dir)
    if old is None or cfg.trainer.resume == "force":
        return []
    from ragen.utils.redaction import redact

    new = json.loads(json.dumps(redact(cfg.to_dict()), default=str))  # as config.json stores it
    diffs = config_differences(old, new, RESUME_KEYS)
    if not diffs:
        return []
    shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diffs[:SHOWN_DIFFERENCES])
    more = f" and {len(diffs) - SHOWN_DIFFERENCES} more" if len(diffs) > SHOWN_DIFFERENCES else ""
    return [f"trainer.output_dir={cfg.trainer.output_dir} holds a run saved with another config ({shown}{more}); "
            "continue it anyway with trainer.resume=force, or choose a new trainer.output_dir"]


def resume_problems(cfg: TrainConfig) -> list[str]:
    """``trainer.resume`` as a checkpoint path must name a complete checkpoint folder."""
    from ragen.utils.checkpoint import COMPLETE_MARKER, is_complete

    resume = cfg.trainer.resume
    if resume in ("auto", "force", "none", "") or is_complete(resume):
        return []
    return [f"trainer.resume={resume!r} is not a complete checkpoint folder (no {COMPLETE_MARKER} marker); pass a "
            "global_step_<n> folder, auto (the latest in trainer.output_dir), force or none"]


def config_differences(old: dict[str, Any], new: dict[str, Any],
                       ignore: frozenset[str] = frozenset()) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for every key present in both nested configs whose values differ,
    sorted by key; keys in ``ignore`` (and keys only one side has: a config of another ragen version) are skipped."""
    a, b = flatten(old), flatten(new)
    return [(k, a[k], b[k]) for k in sorted(set(a) & set(b)) if k not in ignore and a[k] != b[k]]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a.b": value}`` for a nested config dict; ``env.config`` and list values stay whole."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name != "env.config":
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def env_problems(cfg: TrainConfig) -> list[str]:
    """Build and reset each env of the run once (training and validation envs, with their own configs); a
    failure becomes one line naming the env and the cause (a missing optional package names its extra)."""
    import ragen.env
    from ragen.trainer.env_mix import train_groups, val_groups

    out, seen = [], set()
    for g in [*train_groups(cfg), *val_groups(cfg)]:
        key = (g.env.name, json.dumps(g.env.config, sort_keys=True, default=str))
        if key in seen or g.env.name not in ragen.env.names():  # unknown names are validate's problem
            continue
        seen.add(key)
        try:
            ragen.env.make(g.env.name, **dict(g.env.config)).reset(cfg.trainer.seed)
        except Exception as exc:  # noqa: BLE001 - one line per env, whatever the env raised
            out.append(f"env {g.env.name} (env.config {dict(g.env.config)}) cannot be built: {_reason(exc)}")
    return out
