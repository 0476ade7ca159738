"""Running agent programs against the gateway: one program run per episode, all at once, each with a time limit.

A program is the user's callable ``entry(base_url, api_key, task, seed) -> reward``, sync or async: it talks to
``base_url`` (an OpenAI base URL naming its episode, ``.../ep/<episode>/v1``) with any client, and returns its
episode's reward. :func:`run_programs` runs one per task concurrently on the gateway's event loop (an async program
as a task; a sync one on its own thread, so a blocking client blocks only itself).

**The reward** a program returns is one of (:data:`ProgramReturn`):

* a number: the episode's reward, for its last call;
* per-call rewards, a mapping from a response's ``id`` (the ``chatcmpl-...`` id the endpoint answered the call
  with) to that call's reward: a number, or for a call with ``n`` choices a list of ``n`` numbers, one per choice
  (a number gives every choice the same). Calls the mapping does not name get 0. :func:`call_rewards` resolves the
  ids against the episode's records.

A program that raises, hangs past ``time_limit_s`` or returns something else (a non-finite number, a mapping with
a key that is no string or a value that is no finite number or list of them) fails its episode: the error is
recorded (in its :class:`ProgramResult` and in the gateway's episode log), the episode is closed (a later call from
it, e.g. a hung thread that wakes up, is refused with a 400 and records nothing), and every other program goes on.
Python cannot stop a thread, so a hung sync program's thread is left to end by itself (a daemon thread: it does
not keep the process alive).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragen.gateway.record import CallRecord
from ragen.gateway.server import Gateway

ProgramEntry = Callable[[str, str, Any, int], Any]
# What a program returns (module docstring): its episode's reward, or rewards per call by response id.
ProgramReturn = float | Mapping[str, float | Sequence[float]]
RESPONSE_ID_PREFIX = "chatcmpl-"  # a response's ``id`` is this prefix and the call's request id (server.py)


@dataclass(frozen=True)
class ProgramTask:
    """One program run: its episode key (unique among the gateway's episodes), the task and the seed it gets."""

    episode: str
    task: Any
    seed: int


@dataclass(frozen=True)
class ProgramResult:
    """What one run returned: its reward (0.0 when it failed; the sum of its per-call rewards when it returned
    them), whether it failed, and why (``error``); ``per_call``: the per-call rewards it returned (response id ->
    one reward per choice, or one for all its choices), None when it returned a number."""

    episode: str
    reward: float
    failed: bool = False
    error: str = ""
    per_call: dict[str, tuple[float, ...]] | None = None


def _in_thread(entry: ProgramEntry, args: tuple) -> asyncio.Future:
    """``entry(*args)`` on a daemon thread, as a future of the running loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def work() -> None:
        try:
            value, ok = entry(*args), True
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side as the program's error
            value, ok = exc, False
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop has closed: nobody waits for this (timed-out) run any more
            pass

    threading.Thread(target=work, name="ragen-agent-program", daemon=True).start()
    return future


def _is_async(entry: ProgramEntry) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(entry):
        return True
    return not inspect.isfunction(entry) and inspect.iscoroutinefunction(type(entry).__call__)


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _result(episode: str, value: Any) -> ProgramResult:
    """The program's return value (:data:`ProgramReturn`) as its result; a ValueError says why it is not one."""
    fix = ("it must return a finite number (its reward) or a mapping from response ids to per-call rewards "
           "(a finite number, or a list of one per choice)")
    if _number(value):
        return ProgramResult(episode, float(value))
    if not isinstance(value, Mapping):
        raise ValueError(f"the program returned {value!r}; {fix}")
    per_call = {}
    for key, reward in value.items():
        rewards = (reward,) if _number(reward) else tuple(reward) if isinstance(reward, list | tuple) else ()
        if not isinstance(key, str) or not rewards or not all(_number(r) for r in rewards):
            raise ValueError(f"the program returned {{{key!r}: {reward!r}, ...}}; {fix}")
        per_call[key] = tuple(float(r) for r in rewards)
    return ProgramResult(episode, sum(sum(r) for r in per_call.values()), per_call=per_call)


def call_rewards(calls: Sequence[CallRecord], per_call: Mapping[str, tuple[float, ...]]) -> list[float]:
    """Per-call rewards by response id -> one reward per record of ``calls`` (the episode's records, in answer
    order; 0.0 for the calls ``per_call`` does not name). A ValueError names an id that is no call of the episode
    or a list whose length is not the call's number of choices."""
    samples: dict[str, list[int]] = {}
    for i, call in enumerate(calls):
        samples.setdefault(RESPONSE_ID_PREFIX + call.request_id, []).append(i)
    out = [0.0] * len(calls)
    for key, rewards in per_call.items():
        if key not in samples:
            raise ValueError(f"the program returned a reward for {key!r}, which is no response id of its episode "
                             f"(those are {sorted(samples)})")
        index = samples[key]
        if len(rewards) not in (1, len(index)):
            raise ValueError(f"the program returned {len(rewards)} rewards for {key!r}, which has {len(index)} "
                             "choice(s); give a number or one reward per choice")
        for j, i in enumerate(index):
            out[i] = rewards[j if len(rewards) > 1 else 0]
    return out


async def run_program(gateway: Gateway, entry: ProgramEntry, task: ProgramTask, time_limit_s: float,
                      api_key: str = "ragen") -> ProgramResult:
    """One program run (module docstring); never raises for the program's faults."""
    args = (gateway.base_url(task.episode), api_key, task.task, task.seed)
    log = gateway.book.episode(task.episode)
    try:
        if _is_async(entry):
            value = await asyncio.wait_for(entry(*args), time_limit_s)
        else:
            value = await asyncio.wait_for(asyncio.shield(_in_thread(entry, args)), time_limit_s)
        result = _result(task.episode, value)
    except TimeoutError:
        result = ProgramResult(task.episode, 0.0, True, f"timed out after {time_limit_s:g} s")
    except Exception as exc:  # noqa: BLE001 - a program's error fails its episode only
        frames = traceback.format_exception(exc)
        result = ProgramResult(task.episode, 0.0, True, f"{type(exc).__name__}: {exc}\n{''.join(frames[-3:])}")
    log.closed = True
    if result.failed:
        log.fail(result.error)
    return result


async def run_programs(gateway: Gateway, entry: ProgramEntry, tasks: Sequence[ProgramTask], time_limit_s: float,
                       api_key: str = "ragen") -> list[ProgramResult]:
    """Every task's program at once (module docstring); the results in task order. Episode keys must be unique."""
    keys = [t.episode for t in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("each program run needs its own episode key")
    return list(await asyncio.gather(*[run_program(gateway, entry, t, time_limit_s, api_key) for t in tasks]))
