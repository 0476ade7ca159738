"""Running agent programs against the gateway: one program run per episode, all at once, each with a time limit.

A program is the user's callable ``entry(base_url, api_key, task, seed) -> reward``, sync or async: it talks to
``base_url`` (an OpenAI base URL naming its episode, ``.../ep/<episode>/v1``) with any client, and returns its
episode's reward as a number. :func:`run_programs` runs one per task concurrently on the gateway's event loop (an
async program as a task; a sync one on its own thread, so a blocking client blocks only itself).

A program that raises, hangs past ``time_limit_s`` or returns something other than a finite number fails its
episode: the error is recorded (in its :class:`ProgramResult` and in the gateway's episode log), the episode is
closed (a later call from it, e.g. a hung thread that wakes up, is refused with a 400 and records nothing), and
every other program goes on. Python cannot stop a thread, so a hung sync program's thread is left to end by
itself (a daemon thread: it does not keep the process alive).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragen.gateway.server import Gateway

ProgramEntry = Callable[[str, str, Any, int], Any]


@dataclass(frozen=True)
class ProgramTask:
    """One program run: its episode key (unique among the gateway's episodes), the task and the seed it gets."""

    episode: str
    task: Any
    seed: int


@dataclass(frozen=True)
class ProgramResult:
    """What one run returned: its reward (0.0 when it failed), whether it failed, and why (``error``)."""

    episode: str
    reward: float
    failed: bool = False
    error: str = ""


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


def _reward(value: Any) -> float:
    """The program's return value as a reward; a ValueError says why it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"the program returned {value!r}; it must return a finite number (its reward)")
    return float(value)


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
        result = ProgramResult(task.episode, _reward(value))
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
