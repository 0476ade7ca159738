"""A pytest plugin that writes each test's result the moment it is known, so a run stopped part way (a step's time
limit, a killed machine) keeps every result so far. scripts/gpu_check.sh loads it (``-p pytest_live_log``, with
scripts/ on PYTHONPATH) and names the file in ``$RAGEN_TEST_LOG``; without that variable it does nothing.

One line per event, tab-separated, appended and flushed at once:

    <nodeid>  started                  when the test begins (a test that never ends keeps only this line)
    <nodeid>  <outcome>  <seconds>     when a phase ends: every call, and a setup or teardown that did not pass

``<outcome>`` is ``passed``, ``failed (<first line of the error>)`` (pytest-timeout's ``Timeout >Ns`` included) or
``skipped (<reason>)``; ``<seconds>`` is that phase's duration. scripts/gpu_check.py turns the log into one status
per test.
"""

from __future__ import annotations

import os

import pytest

LOG_VAR = "RAGEN_TEST_LOG"


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def outcome_of(report: pytest.TestReport) -> str:
    """``passed``, ``failed (<why>)`` or ``skipped (<reason>)`` of one phase's report."""
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        reason = _one_line(reason).removeprefix("Skipped: ")
        return f"skipped ({reason})" if reason else "skipped"
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        why = crash.message if crash is not None else str(report.longrepr or "").strip().splitlines()[-1:]
        why = _one_line(why if isinstance(why, str) else " ".join(why))
        return f"failed ({why})" if why else "failed"
    return "passed"


def _write(line: str) -> None:
    path = os.environ.get(LOG_VAR)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _write(f"{nodeid}\tstarted")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or not report.passed:
        _write(f"{report.nodeid}\t{outcome_of(report)}\t{report.duration:.1f}")
