"""The registry of config checks and :func:`preflight`, which runs them before Ray or any model starts.

Each check is a function ``cfg -> list[str]`` registered with :func:`register`: its ``name``, the config sections
or dotted keys it ``reads``, the checks it runs ``after`` (it runs only when they reported nothing: e.g. the batch
shapes need valid world sizes, so ``batches`` runs after ``world_sizes``), the algorithm ``families`` it belongs to
and whether it runs once per env of the run (``per_env``). Every message names the offending key(s), the bad
value and the fix. :func:`preflight` runs the checks of ``cfg``'s family in dependency order (registration order
otherwise) and raises one :class:`ConfigError` listing every problem.

The checks live beside what they check and register when their module is imported: the checks both families share
in ``ragen.trainer.config.shared_checks``, the PPO family's in ``ragen.trainer.config.ppo_checks`` (and
``ragen.trainer.config.unread_keys``'s rules), the ArCHer family's in ``ragen.archer.main``; a family module registers
itself with :func:`register_family` (which algorithm names it runs and which env configs its ``per_env`` checks see).
``ragen.launch.validate`` imports both families and calls :func:`preflight`. What the config points at (the model, the
output folder, the envs' first steps) is checked afterwards by ``ragen.trainer.config.resource_checks``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ragen.trainer.config.schema import ConfigError, TrainConfig

CheckFn = Callable[[TrainConfig], list[str]]


@dataclass(frozen=True)
class Check:
    """One registered check (see the module docstring). ``when``: the check applies only where it returns True
    (e.g. an engine's own checks); None: always."""

    name: str
    fn: CheckFn
    reads: tuple[str, ...]
    after: tuple[str, ...] = ()
    families: tuple[str, ...] = ("ppo", "archer")
    per_env: bool = False
    when: Callable[[TrainConfig], bool] | None = None


@dataclass(frozen=True)
class Family:
    """An algorithm family: the ``algorithm.name`` values it runs, and the configs its ``per_env`` checks run on
    (``envs(cfg)``: one per env of the run)."""

    name: str
    algorithms: tuple[str, ...]
    envs: Callable[[TrainConfig], list[TrainConfig]]


CHECKS: dict[str, Check] = {}
FAMILIES: dict[str, Family] = {}


def register(name: str, *, reads: tuple[str, ...], after: tuple[str, ...] = (),
             families: tuple[str, ...] = ("ppo", "archer"), per_env: bool = False,
             when: Callable[[TrainConfig], bool] | None = None) -> Callable[[CheckFn], CheckFn]:
    """Decorator: register the decorated function as the check ``name`` (see :class:`Check`); returns it as is,
    so it can still be called on its own."""
    def add(fn: CheckFn) -> CheckFn:
        CHECKS[name] = Check(name, fn, tuple(reads), tuple(after), tuple(families), per_env, when)
        return fn

    return add


def register_family(name: str, algorithms: tuple[str, ...],
                    envs: Callable[[TrainConfig], list[TrainConfig]] | None = None) -> None:
    """Register the algorithm family ``name`` (``envs`` None: its ``per_env`` checks see ``cfg`` itself)."""
    FAMILIES[name] = Family(name, tuple(algorithms), envs or (lambda cfg: [cfg]))


def family_of(cfg: TrainConfig) -> str:
    """The registered family whose algorithms include ``cfg.algorithm.name``."""
    for family in FAMILIES.values():
        if cfg.algorithm.name in family.algorithms:
            return family.name
    raise RuntimeError(f"no checks are registered for algorithm.name={cfg.algorithm.name!r}: import its family's "
                       "checks first (ragen.launch.validate imports every family's)")


def ordered(family: str) -> list[Check]:
    """The checks of ``family``, each after the checks of the family it names in ``after`` (else in registration
    order; a name in ``after`` that only another family has is no dependency here)."""
    pending = [c for c in CHECKS.values() if family in c.families]
    waits = {c.name: set(c.after) & {p.name for p in pending} for c in pending}  # another family's: nothing to wait
    out: list[Check] = []
    done: set[str] = set()
    while pending:
        ready = next((c for c in pending if waits[c.name] <= done), None)
        if ready is None:
            raise RuntimeError(f"checks {[c.name for c in pending]} wait on each other (a cycle in their 'after')")
        out.append(ready)
        done.add(ready.name)
        pending.remove(ready)
    return out


def problems(cfg: TrainConfig, family: str | None = None) -> list[str]:
    """Every problem of ``cfg`` found by the checks of ``family`` (None: ``cfg``'s own, :func:`family_of`), each
    message once. A check whose ``after`` checks reported problems (or were skipped) is skipped."""
    name = family or family_of(cfg)
    fam = FAMILIES[name]
    failed: set[str] = set()
    out: list[str] = []
    envs: list[TrainConfig] | None = None
    for check in ordered(name):
        if failed & set(check.after):
            failed.add(check.name)
            continue
        if check.when is not None and not check.when(cfg):
            continue
        if check.per_env:
            envs = fam.envs(cfg) if envs is None else envs
            found = [p for sub in envs for p in check.fn(sub)]
        else:
            found = check.fn(cfg)
        if found:
            failed.add(check.name)
            out += found
    return list(dict.fromkeys(out))


def preflight(cfg: TrainConfig, family: str | None = None) -> None:
    """Raise :class:`ConfigError` listing every problem of ``cfg`` (:func:`problems`); nothing is started before
    this passes."""
    found = problems(cfg, family)
    if found:
        raise ConfigError(found)
