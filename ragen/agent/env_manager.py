"""Env groups, seeds, and exception-isolated env calls.

Each ``EnvGroupSpec`` becomes ``n_groups * group_size`` env slots; the slots of one group share a reset
seed and a group id (numbered across all specs, in spec order). Seeds:

* train: ``seed + counter * total_groups + g`` for global group g, where ``counter`` advances by one per
  train rollout, so every call sees fresh, reproducible groups and consecutive calls never repeat a seed;
* val: ``val_seed + g`` on every call.

An exception raised by an env (reset, step, instructions, legal_actions) never escapes: the slot is marked
failed (``EpisodeRecord.failed`` and ``error``), it takes no further turns, and the rest of the batch goes
on. A failed slot's env is rebuilt before its next episode. The same holds for a call that runs longer than
``AgentConfig.env_step_timeout`` seconds (the call is left running in a daemon thread and its env is dropped;
the rollout never waits on it again) and for a ``step`` whose result breaks the protocol (not a ``StepResult``,
a NaN / inf / non-numeric reward, a non-str observation: ``ragen.env.base.step_result_problem``).

Concurrency: the resets, steps and legal-action calls of one batch run in a pool of up to ``AgentConfig.env_workers``
threads (:meth:`EnvManager.map`), so a turn of I/O-bound envs (a search tool, a sandbox) costs the slowest env call,
not their sum. Each call touches one slot only and results are collected in slot order, so a batch is the same for any
pool size. What this asks of an env: its instances may be called at the same time from different threads (one
instance is never called by two threads at once), so state shared between instances (a module-level cache, an index
file, a model) must be locked, and randomness must come from the env's own seeded RNG, never the global ``random`` /
``numpy.random`` state. The shipped envs draw only from their own RNGs (``random.Random(seed)``, gymnasium's per-env
``np_random``) and lock what they share (``ragen.env.bm25_disk.JsonlStore``'s file, ``ragen.env.oracle``'s model).
Pure-Python, CPU-bound envs gain nothing under the GIL: ``env_workers=1`` runs them one after another.
Env construction (``make``, including the rebuild of a failed slot's env) stays in the calling thread.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ragen.agent.batch import EpisodeRecord
from ragen.agent.config import AgentConfig, EnvGroupSpec
from ragen.agent.parser import clean_text
from ragen.env import make
from ragen.env.base import Env, step_result_problem

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def run_each(fn: Callable[[_In], _Out], items: Sequence[_In], workers: int) -> list[_Out]:
    """``[fn(x) for x in items]`` with up to ``workers`` calls at once in a thread pool (one worker or one item: in
    this thread, in order). Results are in item order whatever order the calls end in. ``fn`` is expected to keep
    env errors to itself (the callers' functions fail the slot); anything it lets escape is re-raised here once
    every call has ended."""
    n = min(int(workers), len(items))
    if n <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="ragen-env-pool") as pool:
        return list(pool.map(fn, items))


class EnvTimeout(TimeoutError):
    """An env call ran longer than ``agent.env_step_timeout`` seconds."""


class MalformedStepResult(ValueError):
    """``Env.step`` returned something that breaks the env protocol."""


def call_with_timeout(fn: Callable[..., Any], timeout: float | None, what: str, *args: Any) -> Any:
    """``fn(*args)``, raising :class:`EnvTimeout` (naming ``what``) when it has not returned after ``timeout``
    seconds (None or <= 0: no limit, called directly). The call runs in a daemon thread, so a hung env neither
    blocks the rollout nor the interpreter's exit; what it raises is re-raised here."""
    if not timeout or timeout <= 0:
        return fn(*args)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"ragen-env-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise EnvTimeout(f"{what} did not return within agent.env_step_timeout={timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass
class TurnOutcome:
    """The effect of one turn's actions, executed sequentially (stopping early at ``done``)."""

    reward: float = 0.0
    step_reward: float = 0.0
    outcome_reward: float = 0.0
    has_split: bool = False  # the env reported step_reward / outcome_reward
    tool_result: bool = False  # some action's step returned a tool result (info["tool_result"])
    executed: int = 0
    valid: int = 0
    effective: int = 0
    done: bool = False
    success: bool = False
    observation: str = ""


@dataclass
class EnvSlot:
    """One env and the state of its current episode."""

    spec: EnvGroupSpec
    env: Env | None
    group_id: int
    max_turn: int
    max_actions: int
    seed: int = 0
    observation: str = ""
    done: bool = False
    stopped: bool = False  # ended early by the proxy (prompt does not fit max_model_len): counts as truncated
    failed: bool = False
    error: str = ""
    record: EpisodeRecord | None = None
    actions_total: int = 0
    actions_valid: int = 0
    actions_effective: int = 0
    turn_rewards: list[float] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    tool_results: list[bool] = field(default_factory=list)
    outcome_reward: float = 0.0
    has_split: bool = False
    obs_keys: list[str] = field(default_factory=list)
    timeout: float | None = None  # seconds per env call (AgentConfig.env_step_timeout)

    @property
    def name(self) -> str:
        return self.spec.name

    def begin(self, seed: int) -> None:
        """Clear the previous episode's state before a reset with ``seed``."""
        self.seed, self.observation, self.done, self.failed, self.error = seed, "", False, False, ""
        self.stopped = False
        self.actions_total = self.actions_valid = self.actions_effective = 0
        self.turn_rewards, self.step_rewards, self.tool_results, self.obs_keys = [], [], [], []
        self.outcome_reward, self.has_split = 0.0, False
        self.record = EpisodeRecord(env_name=self.name, seed=seed, group_id=self.group_id)

    def fail(self, where: str, exc: BaseException) -> None:
        """Mark this slot failed by ``exc`` raised in ``where``; the env is rebuilt before the next episode."""
        self.failed = True
        self.done = True
        lines = traceback.format_exception_only(type(exc), exc)
        self.error = f"{where}: {''.join(lines).strip()}"
        if self.record is not None:
            self.record.failed = True
            self.record.error = self.error
        self.env = None


class EnvManager:
    """Builds the env slots of ``specs`` and runs their resets and steps."""

    def __init__(self, specs: list[EnvGroupSpec], agent: AgentConfig) -> None:
        if not specs:
            raise ValueError("no env groups given: pass at least one EnvGroupSpec")
        self.specs = list(specs)
        self.slots: list[EnvSlot] = []
        group = 0
        for spec in self.specs:
            max_turn = spec.max_turn or agent.max_turn
            max_actions = spec.max_actions_per_turn or agent.max_actions_per_turn
            for _ in range(spec.n_groups):
                for _ in range(spec.group_size):
                    env = make(spec.name, **spec.config)  # config errors raise here, before any rollout
                    self.slots.append(EnvSlot(spec, env, group, max_turn, max_actions,
                                              timeout=agent.env_step_timeout))
                group += 1
        self.num_groups = group
        self.workers = agent.env_workers

    def map(self, fn: Callable[[EnvSlot], _Out], slots: Sequence[EnvSlot]) -> list[_Out]:
        """``fn(slot)`` for each of ``slots``, up to ``agent.env_workers`` at once (:func:`run_each`); ``fn`` must
        touch its own slot only."""
        return run_each(fn, slots, self.workers)

    def group_seeds(self, base: int, counter: int) -> list[int]:
        """Seed of each global group for rollout number ``counter`` (0 for validation).

        Per spec: its group g gets ``base + counter * spec.n_groups + g``, so an env plays the same seeds whatever
        other envs share the batch (validation: ``base + g``, the seeds ``ragen.eval`` plays). Two specs of the
        same env therefore replay the same seeds; the trainer gives each env one spec.
        """
        return [base + counter * spec.n_groups + g for spec in self.specs for g in range(spec.n_groups)]

    def reset(self, seeds: list[int]) -> None:
        """Start a new episode in every slot (slot seed = its group's seed); failures are isolated. A failed slot's
        env is rebuilt here, in this thread; the resets run concurrently (:meth:`map`)."""
        ready = []
        for slot in self.slots:
            slot.begin(seeds[slot.group_id])
            try:
                if slot.env is None:
                    slot.env = make(slot.name, **slot.spec.config)
            except Exception as exc:  # noqa: BLE001 - any env bug must stay inside its slot
                slot.fail("reset", exc)
                continue
            ready.append(slot)
        self.map(_reset_slot, ready)

    @staticmethod
    def describe(slot: EnvSlot) -> tuple[str, str]:
        """(instructions, legal actions) of the slot's env; raises what the env raises."""
        assert slot.env is not None
        env = slot.env
        return call_with_timeout(lambda: (str(env.instructions), str(env.legal_actions())), slot.timeout,
                                 f"{slot.name}.legal_actions")

    @staticmethod
    def step(slot: EnvSlot, actions: list[str]) -> TurnOutcome:
        """Execute ``actions`` in order (stop early when done); an env exception fails the slot."""
        out = TurnOutcome(observation=slot.observation)
        for action in actions:
            try:
                assert slot.env is not None
                res = call_with_timeout(slot.env.step, slot.timeout, f"{slot.name}.step", clean_text(action))
                problem = step_result_problem(res)
                if problem is not None:
                    raise MalformedStepResult(problem)
                reward = float(res.reward)
            except Exception as exc:  # noqa: BLE001 - any env bug must stay inside its slot
                slot.fail("step", exc)
                out.done = True
                return out
            info = res.info
            out.executed += 1
            out.valid += bool(info.get("action_is_valid", False))
            out.effective += bool(info.get("action_is_effective", False))
            out.reward += reward
            if "step_reward" in info or "outcome_reward" in info:
                out.has_split = True
                out.step_reward += float(info.get("step_reward", 0.0))
                out.outcome_reward += float(info.get("outcome_reward", 0.0))
            out.tool_result = out.tool_result or bool(info.get("tool_result", False))
            out.success = out.success or bool(info.get("success", False))
            out.observation = str(res.observation)
            if res.done:
                out.done = True
                break
        return out


def _reset_slot(slot: EnvSlot) -> None:
    """Reset the slot's env with its seed (set by ``begin``); an exception or a None observation fails the slot."""
    assert slot.env is not None
    try:
        obs = call_with_timeout(slot.env.reset, slot.timeout, f"{slot.name}.reset", slot.seed)
        if obs is None:
            raise MalformedStepResult("reset returned None, not an observation")
        slot.observation = str(obs)
    except Exception as exc:  # noqa: BLE001 - any env bug must stay inside its slot
        slot.fail("reset", exc)
