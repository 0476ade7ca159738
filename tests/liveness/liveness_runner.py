"""Runs one case of the liveness table (``liveness_model``): builds the context's config and the config with the key
set, validates, runs the case's probe on both and checks the case's expectation. Shared by the test and the
reference generator (which only needs :func:`verdict`, validation without probes)."""

from __future__ import annotations

import functools
from typing import Any

import liveness_probes as P
import liveness_worker as W
from liveness_model import FLIP, Case, Row

from ragen.trainer.config.schema import ConfigError, TrainConfig
from ragen.trainer.config.unread_keys import show

CONFIGS = P.Configs()
PROBES = {**P.PROBES, **W.PROBES}
INERT = "has no effect"


def normalized(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else value


def built(row: Row, case: Case) -> tuple[TrainConfig, TrainConfig | ConfigError]:
    """(the context's config, the config with the row's key set to the case's value, or the ConfigError the schema
    raised for it). Fails when the context itself does not validate or already holds the value."""
    base = CONFIGS.build(case.context)
    own = P.rejection(base, case.context)
    assert own is None, f"the context {case.context} of {row.id} does not validate: {own}"
    current = P.lookup(base, row.key)
    value = (not current) if case.value is FLIP else case.value
    assert normalized(current) != normalized(value), \
        f"{row.id}: the context {case.context} already has {show(value)}; pick another value"
    try:
        alt: TrainConfig | ConfigError = CONFIGS.build(case.context, row.key, value)
    except ConfigError as exc:
        alt = exc
    return base, alt


def verdict(row: Row, case: Case) -> tuple[str, str]:
    """("accepted" | "inert" | "rejected", the error message) of the case's value under validation alone."""
    _, alt = built(row, case)
    err = P.rejection(alt, (*case.context, f"{row.key}=?"))
    if err is None:
        return "accepted", ""
    return ("inert" if INERT in str(err) else "rejected"), str(err)


@functools.cache
def _baseline(probe: str, context: tuple[str, ...]) -> dict:
    return P.run_probe_with(PROBES[probe], CONFIGS.build(context))


def check(row: Row, case: Case) -> None:
    """Assert the case's expectation (see ``liveness_model``); the message names the key, value and context."""
    what = f"{row.id}={show(case.value)} under {list(case.context) or 'the probe base'}"
    base, alt = built(row, case)
    err = P.rejection(alt, (*case.context, f"{row.key}=?"))
    if case.expect == "rejected" or (case.expect == "live" and err is not None and INERT not in str(err)):
        assert err is not None, f"{what} was accepted but the table says validation rejects it"
        named = case.match or row.key.split(".")[-1]
        assert named in str(err), f"{what}: the ConfigError does not name {named!r}: {err}"
        return
    q = case.quantity
    assert q is not None, f"{row.id}: a {case.expect} case needs a quantity"
    if case.expect == "live" and err is not None:  # rejected as having no effect: it must indeed change nothing
        diff = P.differing(_baseline(q.probe, case.context), P.run_probe_with(PROBES[q.probe], alt), q.entries)
        assert not diff, f"{what} is rejected as having no effect, but it changes {diff}: {err}"
        return
    assert err is None, f"{what} is rejected, but the table says it {case.expect}: {err}"
    before, after = _baseline(q.probe, case.context), P.run_probe_with(PROBES[q.probe], alt)
    if case.expect in ("changes", "live"):
        assert P.differing(before, after, q.entries), f"{what} changes none of {q.label} ({q.entries}): a silent no-op"
    else:  # invariant / same: every number the probe returns
        diff = P.differing(before, after, None, rtol=case.tol, atol=case.tol, outliers=case.outliers)
        assert not diff, (f"{what} should leave every number of {q.probe} identical (tol {case.tol}, outliers "
                          f"{case.outliers}) but changes {diff}")
