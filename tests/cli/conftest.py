"""Fixtures of the command-line tests: the Qwen-sized stand-in tokenizer, built once per session."""

from __future__ import annotations

import pytest
from standins import qwen_sized_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory, tokenizer_dir) -> str:
    """A tokenizer of Qwen2.5's size and special-token ids (``standins.qwen_sized_tokenizer``)."""
    return str(qwen_sized_tokenizer(tmp_path_factory.mktemp("qwen-tokenizer"), tokenizer_dir))
