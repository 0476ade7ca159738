"""Stopping a run by signal: Ctrl-C (SIGINT) or a scheduler's preemption (SIGTERM) end the run with one line, a
checkpoint where one can be written, and a distinct exit status (128 + the signal: 130, 143).

:func:`signals_stop_the_run` (entered by the CLI around a run) turns the first SIGINT or SIGTERM into
``ragen.utils.console.Interrupted``, raised in the main thread wherever the program is; the trainer catches it,
saves what can be saved (``PPOTrainer.fit``) and re-raises it with the whole story, and the quiet console prints
that one line. The handlers are the defaults again after the first signal, so a second Ctrl-C stops at once (without
saving).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from ragen.utils.console import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM raises ``Interrupted`` (main thread only; elsewhere a no-op); the
    previous handlers come back at the first signal and on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    def handler(signum: int, frame: object) -> None:
        restore()  # a second signal: the default behaviour, at once
        raise Interrupted(signum)

    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        restore()
