"""Wall-clock timing of named phases (the trainer logs them as ``timing/<name>``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def timed(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent in the ``with`` block to ``timings[name]``.

    Time is recorded even when the block raises, so a failing phase still shows up in the logs.
    Repeated use of one name accumulates (e.g. several mini-batches of one phase).
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
