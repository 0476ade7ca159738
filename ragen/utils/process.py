"""Process priority of the workers: run them at the driver's niceness, not Ray's.

Ray starts its worker processes at niceness 15, the driver keeps its own (usually 0). The phases of a step take
turns (the driver generates, then the workers compute), so on a shared machine any other process, even a
background test run, takes the CPU from the workers first: they run several times slower while the driver does
not. ``match_driver_priority`` sets a worker's niceness to the driver's, which the driver passes in
``RAGEN_DRIVER_NICE`` (``ragen.trainer.builders.start_ray``). Lowering the niceness needs privilege; without it
the worker keeps Ray's and says so once.
"""

from __future__ import annotations

import os

ENV_VAR = "RAGEN_DRIVER_NICE"


def niceness() -> int:
    """This process's niceness (POSIX), 0 where the OS has none."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return 0


def match_driver_priority() -> int:
    """Set this process's niceness to ``$RAGEN_DRIVER_NICE`` when set; returns the niceness it runs at."""
    target = os.environ.get(ENV_VAR)
    if target is None or not hasattr(os, "setpriority"):
        return niceness()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(target))
    except (OSError, ValueError) as exc:
        print(f"[ragen] worker niceness stays {niceness()} (could not match the driver's {target}: {exc})")
    return niceness()


def location() -> dict[str, object]:
    """Where this process runs: ``{"node_id": Ray node id (None outside Ray), "host", "pid"}``; workers report it
    (``WorkerGroup.location``) so placement across a cluster can be checked and a rank's process found."""
    import socket

    node_id = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return {"node_id": node_id, "host": socket.gethostname(), "pid": os.getpid()}
