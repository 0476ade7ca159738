"""A redacting pipe in front of the run's log: what a process writes to its standard output and error reaches
``train.log`` with every secret value replaced (the rules are :mod:`ragen.utils.redaction`'s).

Why a separate process and not a reader thread: a thread dies with its process, so lines still in the pipe when the
trainer is killed (``kill -9``, the OOM killer) would be lost exactly when the log matters most. The reader here is a
small child process in its own session (Ctrl-C on the terminal does not stop it): it reads until every writer has
closed the pipe (the trainer and the children that inherited its descriptors), so everything written before a crash
still reaches the log. It writes each batch of complete lines with one ``write`` on an ``O_APPEND`` descriptor, right
away (nothing buffered in the reader), so several processes appending to one log do not interleave mid-line.

Cheap: the child runs ``python -I -S`` on this file (no site-packages, no torch: ~20 ms to start, a few MB) and
is only started when the environment holds a secret at all (:func:`start` returns ``None`` otherwise, and the
caller writes to the log file directly as before).
"""

from __future__ import annotations

import os
import subprocess
import sys

CHUNK = 1 << 16  # bytes per read
MAX_PENDING = 1 << 16  # a "line" longer than this (no newline yet) is written in pieces


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _redact_bytes(data: bytes, pairs: list[tuple[bytes, bytes]]) -> bytes:
    for value, label in pairs:
        if value in data:
            data = data.replace(value, label)
    return data


def pump(read_fd: int, log_fd: int, secrets: dict[str, str]) -> None:
    """Copy ``read_fd`` to ``log_fd`` until end of file, replacing each secret value (``{value: NAME}``, longest
    first) by ``<redacted:NAME>``. Works on whole lines (ended by ``\\n`` or ``\\r``) so a secret split across two
    reads is still found; a longer run without a line end is written in pieces, keeping back a tail one byte
    shorter than the longest secret (where a secret cut by the read can start)."""
    pairs = [(v.encode(), f"<redacted:{n}>".encode()) for v, n in secrets.items()]
    keep = max((len(v) for v, _ in pairs), default=0)
    pending = b""
    while True:
        chunk = os.read(read_fd, CHUNK)
        if not chunk:
            break
        pending += chunk
        cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
        if cut == 0 and len(pending) > MAX_PENDING:  # redact what is complete; hold back a possible secret's start
            pending = _redact_bytes(pending, pairs)
            cut = len(pending) - max(keep - 1, 0)
        if cut:
            _write_all(log_fd, _redact_bytes(pending[:cut], pairs))
            pending = pending[cut:]
    if pending:
        _write_all(log_fd, _redact_bytes(pending, pairs))


def open_log(path: str | os.PathLike) -> int:
    """An append-only descriptor on the log (created if missing)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def start(path: str | os.PathLike) -> tuple[int, subprocess.Popen] | None:
    """Start the reader for log ``path``: returns the pipe's write end (point descriptors 1 and 2 at it, then close
    it) and the child, or ``None`` when no environment variable holds a secret."""
    from ragen.utils.redaction import secret_values

    if not secret_values():
        return None
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), os.fspath(path)],
                                stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=True, start_new_session=True)
    finally:
        os.close(read_fd)
    return write_fd, proc


def _main(path: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from redaction import secret_values  # the sibling module, without importing the ragen package (torch)

    log_fd = open_log(path)
    try:
        pump(0, log_fd, secret_values())
    finally:
        os.close(log_fd)


if __name__ == "__main__":
    _main(sys.argv[1])
