"""Both implementations of the GAE family run the estimator tests: the fused CPU kernel and the tensor code."""

import pytest

from ragen.algorithms import fused


@pytest.fixture(params=["fused", "tensor"])
def gae_path(request):
    """Runs the test once with the fused C++ kernel and once with the tensor implementation (GPU path)."""
    if request.param == "tensor":
        with fused.disabled():
            yield request.param
        return
    if not fused.available():
        pytest.skip("the fused GAE kernel is not built (pip install -e . needs a C++ compiler)")
    yield request.param
