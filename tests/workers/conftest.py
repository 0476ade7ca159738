"""Shared fixtures for worker tests: tiny random Llama models (helpers in worker_helpers.py; never import this
file: use ``from worker_helpers import ...``)."""

from __future__ import annotations

import pytest
from worker_helpers import make_lm


@pytest.fixture
def lm():
    return make_lm()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """A saved tiny model folder (vocab 1000, with the default tokenizer's files so ``load_model`` works):
    workers load it through the real ``model_name_or_path`` path, and it is far cheaper than the 49k vocab."""
    from ragen.models import DEFAULT_MODEL, load_tokenizer

    path = tmp_path_factory.mktemp("tiny_lm")
    make_lm(seed=1).save_pretrained(path)
    load_tokenizer(DEFAULT_MODEL).save_pretrained(path)
    return str(path)
