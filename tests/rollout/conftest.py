import pytest

from ragen.models import load_tokenizer


@pytest.fixture(scope="session")
def default_tokenizer():
    return load_tokenizer()
