"""Turn a model argument of ``python -m ragen.eval`` into something an engine can load (:class:`ModelSpec`).

Accepted, checked in this order:

* ``openai:<model>``: a model served by an OpenAI-compatible endpoint (``--base-url``, key from
  ``$OPENAI_API_KEY`` or ``--api-key-env NAME``), played with the ``openai`` engine;
* a run folder (``trainer.output_dir``: has ``checkpoints/`` or ``metrics.jsonl``): its latest complete
  checkpoint's ``actor`` folder (``ragen.utils.checkpoint.latest_checkpoint``);
* a checkpoints folder (``<run>/checkpoints``, holding ``global_step_N`` folders): the latest complete one;
* a checkpoint folder (``global_step_N``, or any folder with ``actor/``): its ``actor`` folder, which must be
  complete (``COMPLETE`` marker) and a transformers model;
* a transformers model folder (``config.json`` with a ``model_type``);
* an alias (``smollm2-135m-instruct``), a local ``.gguf`` file or a hub id ``owner/name``
  (``ragen.models.resolve_model_path``: converted or downloaded once, then a local folder).

Local folders must also hold their tokenizer files, which the engine loads with the weights. Every error names
the bad value and lists what is accepted, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen.models.loader import DEFAULT_MODEL
from ragen.utils.checkpoint import COMPLETE_MARKER, checkpoint_step, is_complete, latest_checkpoint

OPENAI_PREFIX = "openai:"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
ACCEPTED = (
    "a run folder (its latest complete checkpoints/global_step_N/actor), a checkpoints folder, a checkpoint "
    "folder global_step_N (its actor/), a transformers model folder (config.json), the alias "
    f"{DEFAULT_MODEL!r}, a .gguf file, a hub id 'owner/name', or openai:<model> with --base-url"
)
_STEP_DIR = re.compile(r"^(\.tmp_)?global_step_\d+$")


class ModelArgError(ValueError):
    """A model argument that is none of the accepted forms (the message names it and lists the forms)."""


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model argument.

    ``label``: the argument as given (the model's name in tables and JSON). ``kind``: ``local`` (``path`` is a
    folder the ``hf`` / ``vllm`` engine loads) or ``openai`` (``path`` is the served model name). ``source``:
    which accepted form matched. ``checkpoint`` / ``step``: the checkpoint folder used and its training step
    (run and checkpoint folders). ``run_config``: the ``config.json`` of the run the checkpoint belongs to, when
    it has one (the env, agent and rollout settings it was trained with). ``base_url`` / ``api_key_env``: the
    endpoint and the name (never the value) of the variable holding its key (openai).
    """

    label: str
    kind: str
    path: str
    source: str
    checkpoint: str | None = None
    step: int | None = None
    run_config: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_model_arg(arg: str, *, base_url: str | None = None, api_key_env: str | None = None,
                      cache_dir: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of one model argument (see the module docstring for the accepted forms).

    Raises :class:`ModelArgError` naming ``arg`` when it matches no form (or matches one but is unusable: a run
    without a complete checkpoint, an incomplete checkpoint, an openai model without ``--base-url``).
    """
    if not arg or not arg.strip():
        raise ModelArgError(f"empty model argument; accepted: {ACCEPTED}")
    if arg.startswith(OPENAI_PREFIX):
        return _openai_spec(arg, base_url, api_key_env)
    path = Path(arg).expanduser()
    if path.is_dir():
        return _folder_spec(arg, path)
    if path.is_file() and path.suffix != ".gguf":
        raise ModelArgError(f"model argument {arg!r} is a file, not a folder; accepted: {ACCEPTED}")
    from ragen.models import resolve_model_path

    try:
        folder = resolve_model_path(arg, cache_dir)
    except (ValueError, OSError) as exc:  # FileNotFoundError (missing package, missing file) is an OSError
        raise ModelArgError(f"model argument {arg!r} is not usable ({exc}); accepted: {ACCEPTED}") from None
    return ModelSpec(arg, "local", folder, "alias, .gguf file or hub id")


def resolve_model_args(args: list[str], *, base_url: str | None = None, api_key_env: str | None = None,
                       cache_dir: str | None = None) -> list[ModelSpec]:
    """Resolve every argument (all errors surface before any model loads); ``--base-url`` / ``--api-key-env``
    without an ``openai:`` argument are rejected, since they would silently do nothing."""
    specs = [resolve_model_arg(a, base_url=base_url, api_key_env=api_key_env, cache_dir=cache_dir) for a in args]
    if (base_url or api_key_env) and not any(s.kind == "openai" for s in specs):
        raise ModelArgError("--base-url / --api-key-env apply only to openai:<model> arguments, and none was given")
    return specs


def has_tokenizer(folder: str | Path) -> bool:
    """True when ``folder`` holds tokenizer files (checkpoints usually do; weights-only folders do not)."""
    folder = Path(folder)
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def _require_tokenizer(arg: str, folder: Path) -> None:
    """The engines load the tokenizer from the model folder itself (``ragen.models.load_model``): a weights-only
    folder fails there, after the first model may already have played, so reject it now."""
    if not has_tokenizer(folder):
        raise ModelArgError(f"model folder {str(folder)!r} (from {arg!r}) has no tokenizer files (tokenizer.json / "
                            "tokenizer_config.json), which the engine loads with the weights; save the base model's "
                            "tokenizer into it: AutoTokenizer.from_pretrained(<base>).save_pretrained(<folder>)")


def _openai_spec(arg: str, base_url: str | None, api_key_env: str | None) -> ModelSpec:
    name = arg[len(OPENAI_PREFIX):].strip()
    if not name:
        raise ModelArgError(f"model argument {arg!r} has no model name after {OPENAI_PREFIX!r}; "
                            "write openai:<served model name>, e.g. openai:Qwen/Qwen2.5-7B-Instruct")
    if not base_url:
        raise ModelArgError(f"model argument {arg!r} needs --base-url, the OpenAI-compatible endpoint "
                            "(e.g. --base-url http://localhost:8000/v1 for `vllm serve`)")
    if not base_url.startswith(("http://", "https://")):
        raise ModelArgError(f"--base-url {base_url!r} must be an http:// or https:// URL, e.g. http://localhost:8000/v1")
    if api_key_env is not None and api_key_env not in os.environ:
        raise ModelArgError(f"--api-key-env {api_key_env!r}: no such environment variable is set "
                            f"(it should hold the API key of {base_url})")
    return ModelSpec(arg, "openai", name, "openai", base_url=base_url, api_key_env=api_key_env or DEFAULT_KEY_ENV)


def _folder_spec(arg: str, path: Path) -> ModelSpec:
    """A run folder, checkpoints folder, checkpoint folder or model folder."""
    if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
        return _latest_spec(arg, path / "checkpoints", "run folder")
    if path.name == "checkpoints" or any(_STEP_DIR.match(c.name) for c in path.iterdir() if c.is_dir()):
        return _latest_spec(arg, path, "checkpoints folder")
    if _STEP_DIR.match(path.name) or (path / "actor").is_dir():
        return _checkpoint_spec(arg, path, "checkpoint folder")
    if _is_model_folder(path):
        _require_tokenizer(arg, path)
        return ModelSpec(arg, "local", str(path), "model folder")
    raise ModelArgError(f"folder {arg!r} is neither a run folder (checkpoints/), a checkpoint folder (actor/) nor "
                        f"a transformers model folder (config.json with model_type); accepted: {ACCEPTED}")


def _latest_spec(arg: str, root: Path, source: str) -> ModelSpec:
    latest = latest_checkpoint(root)
    if latest is None:
        raise ModelArgError(f"{source} {arg!r} has no complete checkpoint under {str(root)!r} (a global_step_N "
                            f"folder with a {COMPLETE_MARKER} marker); pass a checkpoint or model folder instead, "
                            "or wait for the run to save one")
    return _checkpoint_spec(arg, latest, source)


def _checkpoint_spec(arg: str, ckpt: Path, source: str) -> ModelSpec:
    if not is_complete(ckpt):
        raise ModelArgError(f"checkpoint folder {str(ckpt)!r} (from {arg!r}) is incomplete: no {COMPLETE_MARKER} "
                            "marker, so it is still being written or its writing was interrupted")
    actor = ckpt / "actor"
    if not _is_model_folder(actor):
        raise ModelArgError(f"checkpoint folder {str(ckpt)!r} (from {arg!r}) has no actor/ model folder "
                            "(actor/config.json); was it written by ragen.train?")
    _require_tokenizer(arg, actor)
    run_config = ckpt.parent.parent / "config.json"  # <run>/checkpoints/global_step_N
    saved = run_config.is_file() and not _is_model_folder(run_config.parent)
    return ModelSpec(arg, "local", str(actor), source, checkpoint=str(ckpt), step=checkpoint_step(ckpt),
                     run_config=str(run_config) if saved else None)


def _is_model_folder(path: Path) -> bool:
    """A transformers model folder: ``config.json`` with a ``model_type`` (a run's own config.json has none)."""
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False
