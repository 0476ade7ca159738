"""Checks between validation and the first write: the model loads, the output folder is free, the envs build.

``ragen.launch.validate`` checks the config's values; these checks read what the config points at, still before
the run folder, ``config.json``, Ray or any worker exists, so a wrong model path or a reused output folder costs
seconds and prints one line per problem (``ConfigError``), never a traceback:

* the model (``model.path``, or only the tokenizer with ``model.tiny=true``; ``critic.model_path`` when set): its
  transformers config and tokenizer load (``ragen.models.inspect_model``; a dry run reads no weights), and belong
  together (:func:`tokenizer_problems`);
* with the vLLM engine, ``rollout.vllm.tensor_parallel_size`` splits the model's heads evenly
  (:func:`tensor_parallel_problems`);
* on GPUs (PPO family), the memory plan fits one GPU (``ragen.trainer.config.memory_checks``; ``trainer.memory_check``);
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

from ragen.models.shape import ModelShape, model_shape, tiny_shape
from ragen.trainer.config.schema import ConfigError, TrainConfig

# Keys a continued run may change: its length, resume mode, logging, progress, reporting (the collapse metrics too),
# fault handling and where the workers run (Ray or in-process, its cluster and placement) and their state waits
# between phases, none of which changes what the steps compute. Every other key must equal the saved run's.
RESUME_KEYS = frozenset({
    "trainer.total_steps", "trainer.resume", "trainer.val_only", "trainer.dry_run", "trainer.output_dir",
    "trainer.verbose", "trainer.progress_bar", "trainer.loggers", "trainer.project_name", "trainer.experiment_name",
    "trainer.save_freq", "trainer.val_freq", "trainer.keep_last_ckpt", "trainer.report",
    "trainer.report_train_samples", "trainer.report_val_samples", "trainer.collapse_every", "trainer.collapse_prompts",
    "trainer.max_restarts",
    "trainer.max_consecutive_skips", "trainer.max_failed_steps", "trainer.worker_call_timeout_s",
    "trainer.worker_start_timeout_s",
    "trainer.placement_timeout_s", "trainer.ray_address", "trainer.num_threads", "trainer.cpus_per_worker",
    "trainer.use_ray", "trainer.placement_strategy", "trainer.offload", "model.cache_dir", "trainer.gpu_memory_gb",
    "trainer.memory_check",
})
SHOWN_DIFFERENCES = 6  # differing keys named in the message (the rest are counted)


@dataclass(frozen=True)
class ModelCheck:
    """What the model check found: ``summary`` (architecture, sizes, parameters) and ``tokenizer`` (class,
    vocabulary, special tokens) for the plan, and the policy's ``shape`` (None when its config lacks a size)."""

    summary: str
    tokenizer: str
    shape: ModelShape | None = None


def check_before_start(cfg: TrainConfig, *, dry_run: bool = False) -> ModelCheck:
    """Run every check of this module (envs only when ``dry_run``; a real run converts or downloads the model's
    weights here, as its start would); raises one ``ConfigError`` listing every problem."""
    problems = run_dir_problems(cfg) + resume_problems(cfg)
    model, model_problems = _model_check(cfg, convert=not dry_run)
    problems += model_problems
    if model.shape is not None:
        problems += tensor_parallel_problems(cfg, model.shape) + _memory_problems(cfg, model.shape)
    if dry_run:
        problems += env_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return model


def _memory_problems(cfg: TrainConfig, shape: ModelShape) -> list[str]:
    from ragen.trainer.config import memory_checks

    if not memory_checks.applies(cfg):
        return []
    return memory_checks.memory_problems(cfg, *memory_checks.memory_plan(cfg, shape))


def tensor_parallel_problems(cfg: TrainConfig, shape: ModelShape) -> list[str]:
    """vLLM splits the attention heads over ``rollout.vllm.tensor_parallel_size`` GPUs: the query heads evenly, and
    the key/value heads evenly or, when there are fewer of them than GPUs, each head on a whole number of GPUs."""
    tp = cfg.rollout.vllm.tensor_parallel_size
    if cfg.rollout.engine != "vllm" or tp <= 1:
        return []
    kv_ok = shape.kv_heads % tp == 0 if shape.kv_heads >= tp else tp % shape.kv_heads == 0
    if shape.heads % tp == 0 and kv_ok:
        return []
    fits = [n for n in range(1, cfg.trainer.n_gpus_per_node + 1) if shape.heads % n == 0
            and (shape.kv_heads % n == 0 if shape.kv_heads >= n else n % shape.kv_heads == 0)]
    return [f"rollout.vllm.tensor_parallel_size={tp} does not split the model's {shape.heads} attention heads and "
            f"{shape.kv_heads} key/value heads evenly over {tp} GPUs, so vLLM would refuse to start; use one of "
            f"{fits or [1]}"]


def tokenizer_problems(config: Any, tokenizer: Any, key: str) -> list[str]:
    """The tokenizer must belong to the model of ``config`` (``key`` names the model's config key).

    Every id the tokenizer produces indexes the embedding, so ``len(tokenizer) <= vocab_size`` (a padded embedding,
    as Qwen2.5's 152064 rows for 151665 tokens, is fine); the end-of-turn token (the tokenizer's eos, which ends
    every response) must be an id below vocab_size; and the model config's bos / eos ids must be special tokens of
    this tokenizer (they are the tokens the model was trained to start and stop with: another model's tokenizer
    has other ids there, or none)."""
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):
        return []
    size, out = len(tokenizer), []
    fix = f"use the model's own tokenizer (model.tokenizer_path, or the tokenizer files in the {key} folder)"
    if size > vocab:
        out.append(f"the tokenizer has {size} tokens but {key}'s vocab_size is {vocab}: ids >= {vocab} have no "
                   f"embedding; {fix}")
    eot = tokenizer.eos_token
    eot_id = tokenizer.convert_tokens_to_ids(eot) if eot is not None else None
    if eot_id is None or not 0 <= eot_id < vocab:
        out.append(f"the tokenizer's end-of-turn token {eot!r} (id {eot_id}) is not below {key}'s vocab_size "
                   f"{vocab}; {fix}")
    specials = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        ids = [value] if isinstance(value, int) else list(value or [])
        strangers = [i for i in ids if i not in specials]
        if strangers:
            out.append(f"{key}'s config has {name}={value}, but id {strangers[0]} is no special token of the "
                       f"tokenizer ({type(tokenizer).__name__}, {size} tokens): the tokenizer does not belong to the "
                       f"model; {fix}")
    return out


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
    critic = load("critic.model_path", cfg.critic.model_path, tokenizer=False)[0] if cfg.critic.model_path else None
    if problems:
        return ModelCheck("", ""), problems
    for key, cfg_of in (("model.path", config), ("critic.model_path", critic)):
        if cfg_of is not None:
            problems += tokenizer_problems(cfg_of, tokenizer, key)
    if m.tiny:
        summary = (f"tiny random Llama (hidden {m.tiny_hidden_size}, {m.tiny_num_layers} layers, {m.tiny_num_heads} "
                   "heads)")
        shape = tiny_shape(m.tiny_hidden_size, m.tiny_num_layers, m.tiny_num_heads, len(tokenizer))
    else:
        summary, shape = model_summary(config), model_shape(config)
    return ModelCheck(summary, tokenizer_summary(tokenizer), shape), problems


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, (ValueError, OSError)) and text else f"{type(exc).__name__}: {text}"


def model_summary(config: Any) -> str:
    """One line: architecture, layers, hidden size, heads, vocabulary and the parameter count (``ModelShape``)."""
    arch = (getattr(config, "architectures", None) or [getattr(config, "model_type", "?")])[0]
    layers, hidden = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    parts = [str(arch)]
    if layers and hidden and heads:
        parts.append(f"{layers} layers, hidden {hidden}, {heads} heads ({kv} key/value)")
    parts.append(f"vocab {getattr(config, 'vocab_size', '?')}")
    shape = model_shape(config)
    if shape is not None:
        parts.append(f"~{shape.params / 1e9:.2f}B parameters")
    return ", ".join(parts)


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
    """Build each env of the run once (training and validation envs, with their own configs) and play one step of it
    (``ragen.env.base.smoke_test``: reset, instructions, legal_actions, one step and its ``StepResult``); a failure
    becomes one line naming the env and the cause (a missing optional package names its extra)."""
    import ragen.env
    from ragen.env.base import smoke_test
    from ragen.trainer.config.env_mix import train_groups, val_groups

    out, seen = [], set()
    for g in [*train_groups(cfg), *val_groups(cfg)]:
        key = (g.env.name, json.dumps(g.env.config, sort_keys=True, default=str))
        if key in seen or g.env.name not in ragen.env.names():  # unknown names are validate's problem
            continue
        if ragen.env.is_program(g.env.name):  # a program, not a stepped env: validate built it (its entry)
            continue
        seen.add(key)
        try:
            env = ragen.env.make(g.env.name, **dict(g.env.config))
        except Exception as exc:  # noqa: BLE001 - one line per env, whatever the env raised
            out.append(f"env {g.env.name} (env.config {dict(g.env.config)}) cannot be built: {_reason(exc)}")
            continue
        out += [f"env {g.env.name} breaks the env protocol (ragen.env.base): {problem}; every episode of a run "
                "would fail" for problem in smoke_test(env, cfg.trainer.seed)]
    return out
