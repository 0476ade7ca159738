"""The bridge warns once when the installed verl is not a 0.9.x release (it subclasses verl internals)."""

from __future__ import annotations

import importlib
import warnings

import pytest

manager = pytest.importorskip(
    "ragen_external.verl.manager",
    reason="verl 0.9.1 is not importable: install it with `bash scripts/setup_verl.sh` (external/verl/README.md)",
    exc_type=ImportError,
)


def test_version_series():
    from ragen_external.verl import check_verl_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_verl_version("0.9.1") and check_verl_version("0.9.4.dev0")


def test_other_verl_versions_warn_once_at_import(monkeypatch):
    import ragen_external.verl as bridge
    import verl
    from ragen_external.verl import agent_loop

    monkeypatch.setattr(bridge, "_warned_versions", set())
    monkeypatch.setattr(verl, "__version__", "0.10.2")
    with pytest.warns(UserWarning, match=r"written against verl 0\.9\.1 \(0\.9\.x\); verl 0\.10\.2 is installed"):
        importlib.reload(manager)
    with warnings.catch_warnings():  # once: importing the other verl-dependent module says nothing more
        warnings.simplefilter("error")
        importlib.reload(agent_loop)
    monkeypatch.setattr(verl, "__version__", "1.9.0")  # "1.9" is not "0.9"
    with pytest.warns(UserWarning, match=r"verl 1\.9\.0 is installed"):
        importlib.reload(agent_loop)
    monkeypatch.setattr(verl, "__version__", "0.9.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(manager)
    assert bridge._warned_versions == {"0.10.2", "1.9.0"}
