"""The vocabulary of the liveness table (``liveness_table.py``): quantities, cases, rows and the helpers that build
them, so that covering a new key is one table row.

A row names one config key and how every alternative value of it behaves, as cases run under a context (Hydra
overrides over ``liveness_probes.PROBE_BASE``):

* ``changes``: validation accepts the value and the named quantity (probe entries) differs from the context's own;
* ``rejected``: validation (``ragen.launch.validate``, or the schema) raises a ConfigError naming the key;
* ``invariant``: a speed / memory knob; every number the probe returns stays identical (``tol`` 0) or within
  ``tol`` (relative and absolute) where the knob reorders floating-point sums, except at most a fraction
  ``outliers`` of each tensor's entries (parameters after an Adam step: see ``liveness_table.ADAM``);
* ``same``: the value is what the context's own value resolves to (e.g. ``critic.enable=true`` where null already
  means on); every number stays identical;
* ``live``: the estimator walk of ``algorithm`` / ``actor`` keys: accepted and changes the quantity, or rejected as
  having no effect (``ragen.trainer.config.unread_keys``), in which case the quantity indeed stays identical.

``allow`` rows carry no cases, only the reason the key is outside all of these (paths, logging, Ray placement...).
``xfail`` marks a case that is a known silent no-op on the current code (a strict xfail: it fails once fixed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ESTIMATORS = ("gae", "turn_gae", "bilevel_gae", "weighted_gae", "grpo", "rloo", "reinforce_pp", "ms_grpo", "ms_po",
              "gigpo")
LAYOUTS = ("trajectory", "turn")
STEP_SPLIT = ("ms_grpo", "ms_po")  # validation requires an env with the step / outcome split (search_qa)


class _Flip:
    """The value of a case on a boolean key whose context value varies (e.g. ``algorithm.whiten`` per estimator):
    the negation of the context's own value."""

    def __repr__(self) -> str:
        return "flip"


FLIP = _Flip()


@dataclass(frozen=True)
class Quantity:
    """Entries of one probe's output (``liveness_probes.PROBES`` / ``liveness_worker.PROBES``) and their name in the
    reference. ``entries`` None: every entry the probe returns."""

    probe: str
    entries: tuple[str, ...] | None
    label: str
    slow: bool = False


@dataclass(frozen=True)
class Case:
    context: tuple[str, ...]
    value: Any
    expect: str  # changes | rejected | invariant | same | live
    quantity: Quantity | None = None
    tol: float = 0.0
    outliers: float = 0.0  # invariant: the fraction of a tensor's entries allowed beyond ``tol``
    xfail: str = ""
    skip: Callable[[], str | None] | None = None  # a reason to skip on this machine, or None
    match: str = ""  # rejected: text the ConfigError must hold (default: the key's last part)
    only: str = ""  # the machines the case runs on, for the reference (with ``skip``)


@dataclass(frozen=True)
class Row:
    key: str
    cases: tuple[Case, ...] = ()
    env: str | None = None  # env.config rows: the env whose constructor takes the key
    allow: str = ""  # allow-list reason (no cases)
    note: str = ""  # extra text for the reference

    @property
    def id(self) -> str:
        return f"{self.env}:{self.key}" if self.env else self.key


@dataclass
class Table:
    """Rows in order; ``add`` refuses a second row for a key."""

    rows: list[Row] = field(default_factory=list)

    def add(self, key: str, *cases: Case | list[Case], env: str | None = None, note: str = "") -> None:
        flat: list[Case] = []
        for c in cases:
            flat.extend(c if isinstance(c, list) else [c])
        self._put(Row(key, tuple(flat), env=env, note=note))

    def allow(self, key: str, reason: str, env: str | None = None) -> None:
        self._put(Row(key, (), env=env, allow=reason))

    def _put(self, row: Row) -> None:
        if any(r.id == row.id for r in self.rows):
            raise ValueError(f"two rows for {row.id}")
        self.rows.append(row)

    def by_id(self) -> dict[str, Row]:
        return {r.id: r for r in self.rows}


def _ctx(when: tuple[str, ...] | str) -> tuple[str, ...]:
    return (when,) if isinstance(when, str) else tuple(when)


def changes(q: Quantity, *values: Any, when: tuple[str, ...] | str = (), xfail: str = "",
            skip: Callable[[], str | None] | None = None, only: str = "") -> list[Case]:
    return [Case(_ctx(when), v, "changes", q, xfail=xfail, skip=skip, only=only) for v in values]


def rejected(*values: Any, when: tuple[str, ...] | str = (), skip: Callable[[], str | None] | None = None,
             match: str = "") -> list[Case]:
    return [Case(_ctx(when), v, "rejected", skip=skip, match=match) for v in values]


def invariant(q: Quantity, *values: Any, tol: float | tuple[float, float] = 0.0,
              when: tuple[str, ...] | str = ()) -> list[Case]:
    """``tol``: a tolerance, or (tolerance, fraction of entries allowed beyond it)."""
    tol, outliers = tol if isinstance(tol, tuple) else (tol, 0.0)
    return [Case(_ctx(when), v, "invariant", q, tol=tol, outliers=outliers) for v in values]


def same(q: Quantity, *values: Any, when: tuple[str, ...] | str = (),
         skip: Callable[[], str | None] | None = None, only: str = "") -> list[Case]:
    return [Case(_ctx(when), v, "same", q, skip=skip, only=only) for v in values]


def estimator_context(estimator: str, layout: str) -> tuple[str, ...]:
    """The walk's context for one estimator and layout: its ``config/algorithm`` group (plus search_qa, the env with a
    step / outcome split, for MS-GRPO / MS-PO) and the layout."""
    env = ("env=search_qa",) if estimator in STEP_SPLIT else ()
    return (f"algorithm={estimator}", *env, f"agent.layout={layout}")


def sweep(q: Quantity, *values: Any, whens: tuple[tuple[str, ...], ...] = ((),),
          estimators: tuple[str, ...] = ESTIMATORS,
          xfail: Callable[[str, tuple[str, ...]], str] | None = None) -> list[Case]:
    """``live`` cases of ``values`` under every estimator (of ``estimators``) x layout, once per extra context in
    ``whens``; ``xfail(estimator, when)`` gives a known no-op's reason ('' for none)."""
    out = []
    for when in whens:
        for est in estimators:
            for layout in LAYOUTS:
                reason = xfail(est, when) if xfail else ""
                out += [Case((*estimator_context(est, layout), *when), v, "live", q, xfail=reason) for v in values]
    return out
