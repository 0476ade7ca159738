"""A quiet console: our start-up block, one progress bar, a short per-step table and the final summary on the
terminal; everything else (Ray, transformers, wandb, warnings, worker output) in ``<run dir>/train.log``.

How: the CLI (``python -m ragen.train`` / ``ragen.sft``) enters :func:`quiet_console` unless ``trainer.verbose``.
It keeps handles on the real terminal (duplicates of file descriptors 1 and 2: :func:`say` writes to the first,
the progress bar to the second), then points descriptors 1 and 2 at ``train.log``, so output written by
libraries, C code and Python warnings lands in the file whatever stream object they hold. Ray workers inherit
``RAGEN_LOG_FILE`` (see ``ragen.trainer.builders.start_ray``) and point their own descriptors at the same file
in :func:`redirect_worker_output` (appends of whole lines from several processes do not interleave mid-line).
When the environment holds a secret, descriptors 1 and 2 point at a pipe instead, read by a small child process
that writes to the log with every secret redacted (:mod:`ragen.utils.log_redactor`; it drains the pipe even when
this process is killed, so no line written before a crash is lost).
In-process use (tests, notebooks) never enters it and prints everything as before.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from ragen.utils import log_redactor

LOG_VAR = "RAGEN_LOG_FILE"


class RunStopped(RuntimeError):
    """A run that stops for a stated reason (NaN steps, every episode failing): the console prints its message as
    one line, not a traceback (``train.log`` keeps the traceback), and the CLI exits with ``exit_code``."""

    exit_code = 1


class Interrupted(KeyboardInterrupt):
    """A signal asked the run to stop (``ragen.utils.interrupts``); ``exit_code`` = 128 + the signal (130 for
    SIGINT, 143 for SIGTERM). A ``KeyboardInterrupt``, so that no ``except Exception`` on its way (an env's guard, a
    retry loop) swallows it; printed as one line like :class:`RunStopped`."""

    def __init__(self, signum: int, message: str | None = None) -> None:
        import signal

        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")

    def with_message(self, message: str) -> Interrupted:
        """The same interruption with the trainer's account of it."""
        return Interrupted(self.signum, message)


STOPS = (RunStopped, Interrupted)  # a stated reason: one line on the console, the CLI exits with its exit_code
_out: TextIO | None = None
_err: TextIO | None = None
_worker_reader: subprocess.Popen | None = None


def is_quiet() -> bool:
    """True inside :func:`quiet_console` (not verbose)."""
    return _out is not None


def out_stream() -> TextIO:
    """The terminal's standard output: the saved stream inside :func:`quiet_console`, else ``sys.stdout``."""
    return _out if _out is not None else sys.stdout


def err_stream() -> TextIO:
    """The terminal's standard error (progress bars): the saved stream inside :func:`quiet_console`, else
    ``sys.stderr``."""
    return _err if _err is not None else sys.stderr


def say(text: str) -> None:
    """Print ``text`` on the terminal's standard output (through tqdm, so an open progress bar stays intact), with
    secrets redacted (a batch system often keeps the terminal's output in a file too)."""
    from tqdm import tqdm

    from ragen.utils.redaction import redact_text

    tqdm.write(redact_text(text), file=out_stream())


def _point_fds_at(path: Path) -> subprocess.Popen | None:
    """Point descriptors 1 and 2 at ``path``: through the redacting reader when there are secrets (returned, so the
    caller can wait for it to drain), else at the file itself."""
    started = log_redactor.start(path)
    fd, reader = started if started is not None else (log_redactor.open_log(path), None)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    return reader


def _wait_drained(reader: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Let the redacting reader write out what is still in its pipe. It ends when every writer has closed the pipe;
    a child that inherited the descriptors and still runs (a lingering Ray process) keeps it open, and then the
    reader goes on in the background until that child exits."""
    if reader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            reader.wait(timeout=timeout_s)


def _quiet_libraries() -> None:
    """Progress bars of transformers / huggingface_hub off (they only mean anything live)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with contextlib.suppress(ImportError):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


@contextlib.contextmanager
def quiet_console(log_path: str | Path, verbose: bool = False) -> Iterator[Path]:
    """Send all output but :func:`say` and the progress bar to ``log_path`` for the duration (unless ``verbose``).

    Restores the descriptors, ``sys.stdout`` / ``sys.stderr`` and the environment on exit, also on errors; an
    error's traceback is printed on the terminal too, since a run that dies must say why where it was started.
    """
    global _out, _err
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if verbose:
        yield log_path
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    _out, _err = (os.fdopen(os.dup(saved[fd]), "w", buffering=1, encoding="utf-8", errors="replace") for fd in (1, 2))
    old_env = os.environ.get(LOG_VAR)
    os.environ[LOG_VAR] = str(log_path)
    reader = _point_fds_at(log_path)
    saved_streams = sys.stdout, sys.stderr  # replaced ones too (notebooks, capture), pointed at the log meanwhile
    sys.stdout, sys.stderr = (os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")
                              for fd in (1, 2))
    _quiet_libraries()
    try:
        yield log_path
    except BaseException as exc:
        if not isinstance(exc, SystemExit):
            import traceback

            from ragen.utils.redaction import redact_text

            text = redact_text("".join(traceback.format_exception(exc)))
            if isinstance(exc, STOPS):  # a stated reason: one line here, the traceback in the log
                print(text, file=sys.stderr, flush=True)
                _err.write(f"[ragen] {redact_text(str(exc))}\n[ragen] the full log is {log_path}\n")
            else:
                _err.write(text)
                _err.write(f"[ragen] the run failed; the full log is {log_path}\n")
        raise
    finally:
        sys.stdout.close()
        sys.stderr.close()
        sys.stdout, sys.stderr = saved_streams
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        _out.close()
        _err.close()
        _out = _err = None
        _wait_drained(reader)
        if old_env is None:
            os.environ.pop(LOG_VAR, None)
        else:
            os.environ[LOG_VAR] = old_env


def redirect_worker_output() -> None:
    """In a worker process: when the driver is quiet (``RAGEN_LOG_FILE`` set), write this process's output to the
    run's log instead of Ray's per-worker files, which Ray would echo on the driver's terminal."""
    path = os.environ.get(LOG_VAR)
    if not path or is_quiet():  # in the driver (in-process workers): quiet_console already points them there
        return
    sys.stdout.flush()
    sys.stderr.flush()
    global _worker_reader
    _worker_reader = _point_fds_at(Path(path))  # runs as long as this process (and its children) write
    warnings.simplefilter("default")
    _quiet_libraries()


@contextlib.contextmanager
def library_messages_to(log_path: str | Path | None) -> Iterator[None]:
    """For the duration, keep library messages off the console of a command without a run folder (``ragen.eval``):
    Python warnings (e.g. transformers' and torch's deprecation warnings), transformers' log records and its
    progress bars. They are appended to ``log_path`` when given, else dropped; ragen's own output is untouched.
    Everything is restored on exit."""
    import logging

    from transformers.utils import logging as hf_logging

    handler: logging.Handler = logging.NullHandler()
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    py_warnings, hf_root = logging.getLogger("py.warnings"), hf_logging.get_logger()
    saved = py_warnings.propagate, hf_logging.is_progress_bar_enabled()
    logging.captureWarnings(True)  # warnings.warn -> the py.warnings logger (the filters still apply)
    py_warnings.propagate = False
    py_warnings.addHandler(handler)
    hf_logging.disable_default_handler()
    hf_root.addHandler(handler)
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # each distinct warning once per location, into the log
            yield
    finally:
        logging.captureWarnings(False)
        py_warnings.removeHandler(handler)
        py_warnings.propagate = saved[0]
        hf_root.removeHandler(handler)
        hf_logging.enable_default_handler()
        if saved[1]:
            hf_logging.enable_progress_bar()
        handler.close()
