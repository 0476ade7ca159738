"""A fake CUDA memory accountant for CPU tests: which owners would hold GPU memory, and how much, as a training step
calls its worker groups and its engine.

Wrap the trainer's worker groups (:meth:`Accountant.group`) and its engine (:meth:`Accountant.engine`); every call
goes through to the real object and updates the accounting first:

* owners: ``<role>/params``, ``<role>/grads``, ``<role>/optim`` (actor, critic; the reference has params only),
  ``engine/weights``, ``engine/kv_cache``, each with a size in :attr:`Accountant.sizes`;
* at start the workers' parameters and the engine (weights and KV cache) are resident, no optimizer state yet;
* ``offload(params=, optimizer=)`` / ``reload()`` remove / restore the group's owners;
* a pass that reads parameters (log-probs, values, update, the weight sync's ``full_state_dict``) needs them
  resident, an update its optimizer state too (else :attr:`Accountant.violations` names the call); an update holds
  its gradients during the call and leaves the optimizer state resident (AdamW creates it at the first step);
* ``engine.sleep()`` frees the engine's owners; ``engine.wake(tags)`` restores ``weights`` / ``kv_cache`` (None:
  both), and a KV-cache wake records which training owners were resident at that moment (:attr:`at_kv_wake`).

:attr:`Accountant.peak` is the largest total over the whole run of calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

READS_PARAMS = ("compute_log_probs", "compute_ref_log_probs", "compute_values", "compute_log_probs_and_values",
                "update", "full_state_dict", "sync_engine_weights")
TRAINING_OWNERS = ("actor/params", "actor/grads", "actor/optim", "critic/params", "critic/grads", "critic/optim",
                   "ref/params")


@dataclass
class Accountant:
    sizes: dict[str, int]
    resident: set[str] = field(default_factory=set)
    peak: int = 0
    violations: list[str] = field(default_factory=list)
    at_kv_wake: list[frozenset[str]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def total(self) -> int:
        return sum(self.sizes[o] for o in self.resident)

    def note(self, event: str) -> None:
        self.events.append(event)
        self.peak = max(self.peak, self.total())

    def group(self, role: str, group: Any) -> AccountedGroup:
        self.resident.add(f"{role}/params")
        self.note(f"{role} built")
        return AccountedGroup(role, group, self)

    def engine(self, engine: Any) -> AccountedEngine:
        self.resident |= {"engine/weights", "engine/kv_cache"}
        self.note("engine built")
        return AccountedEngine(engine, self)


class AccountedGroup:
    """A worker group whose calls are accounted for (see the module docstring); everything else is the group's."""

    def __init__(self, role: str, group: Any, acc: Accountant) -> None:
        self.role, self.inner, self.acc = role, group, acc
        self.off: set[str] = set()  # owners of this role offloaded
        self.has_optim = False

    def _owner(self, part: str) -> str:
        return f"{self.role}/{part}"

    def _before(self, method: str, kw: dict) -> None:
        acc = self.acc
        if method == "offload":
            parts = (["params", "grads"] if kw.get("params", True) else []) + \
                (["optim"] if kw.get("optimizer", True) else [])
            for part in parts:
                if self._owner(part) in acc.resident:
                    acc.resident.discard(self._owner(part))
                    self.off.add(self._owner(part))
            acc.note(f"{self.role}.offload")
        elif method == "reload":
            acc.resident |= self.off
            self.off.clear()
            acc.note(f"{self.role}.reload")
        elif method in READS_PARAMS:
            if self._owner("params") not in acc.resident:
                acc.violations.append(f"{self.role}.{method} with its parameters off the GPU")
            if method == "update":
                if self.has_optim and self._owner("optim") not in acc.resident:
                    acc.violations.append(f"{self.role}.update with its optimizer state off the GPU")
                acc.resident |= {self._owner("grads"), self._owner("optim")}
                self.has_optim = True
            acc.note(f"{self.role}.{method}")

    def _after(self, method: str) -> None:
        if method == "update":  # zero_grad(set_to_none=True) ends every optimizer step
            self.acc.resident.discard(self._owner("grads"))
            self.acc.note(f"{self.role}.update done")

    def call(self, method: str, *args: Any, **kw: Any) -> Any:
        self._before(method, kw)
        out = self.inner.call(method, *args, **kw)
        self._after(method)
        return out

    def call_rank0(self, method: str, *args: Any, **kw: Any) -> Any:
        self._before(method, kw)
        out = self.inner.call_rank0(method, *args, **kw)
        self._after(method)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AccountedEngine:
    """An engine whose sleep / wake are accounted for; generation and weight updates go to the real engine."""

    def __init__(self, engine: Any, acc: Accountant) -> None:
        self.inner, self.acc = engine, acc

    def sleep(self) -> None:
        self.acc.resident -= {"engine/weights", "engine/kv_cache"}
        self.acc.note("engine.sleep")
        self.inner.sleep()

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        acc = self.acc
        if tags is None or "weights" in tags:
            acc.resident.add("engine/weights")
        if tags is None or "kv_cache" in tags:
            acc.at_kv_wake.append(frozenset(acc.resident & set(TRAINING_OWNERS)))
            acc.resident.add("engine/kv_cache")
        acc.note(f"engine.wake{tags}")
        self.inner.wake(tags)

    def update_weights(self, state: Any) -> Any:
        if "engine/weights" not in self.acc.resident:
            self.acc.violations.append("engine.update_weights with the engine's weights asleep")
        return self.inner.update_weights(state)

    def generate(self, *args: Any, **kw: Any) -> Any:
        if not {"engine/weights", "engine/kv_cache"} <= self.acc.resident:
            self.acc.violations.append("engine.generate with the engine asleep")
        return self.inner.generate(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
