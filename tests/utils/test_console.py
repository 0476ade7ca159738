"""The quiet console: our lines on the terminal, everything else (libraries, C-level writes, warnings) in the log."""

import subprocess
import sys

import pytest

from ragen.utils import console
from ragen.utils.tracking import bar_postfix, console_metrics

SCRIPT = """
import os, sys, warnings
from ragen.utils import console
from ragen.utils.tracking import ConsoleLogger
log = sys.argv[1]
with console.quiet_console(log):
    assert console.is_quiet() and os.environ[console.LOG_VAR] == log
    os.write(1, b"c-level stdout\\n")
    os.write(2, b"c-level stderr\\n")
    print("python print")
    print("python stderr", file=sys.stderr)
    warnings.warn("a library warning", UserWarning, stacklevel=1)
    console.say("[ragen] ours")
    ConsoleLogger().log({"actor/pg_loss": 0.5, "actor/grad_norm": 3.0, "env/bandit/success": 0.25}, 7)
assert not console.is_quiet() and console.LOG_VAR not in os.environ
print("after")
"""


def test_quiet_console_splits_terminal_and_log(tmp_path):
    """As the CLI runs it (a fresh process whose streams are the terminal's)."""
    log = tmp_path / "run" / "train.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out, err = proc.stdout, proc.stderr
    text = log.read_text()
    for line in ("c-level stdout", "c-level stderr", "python print", "python stderr", "a library warning"):
        assert line in text and line not in out + err, line
    assert "[ragen] ours" in out and "[ragen] ours" not in text
    # the compact table on the terminal, the full one in the log
    assert "actor/pg_loss" in out and "env/bandit/success" in out and "actor/grad_norm" not in out
    assert "actor/grad_norm" in text
    assert out.rstrip().endswith("after")


def test_quiet_console_reports_a_failure_on_the_terminal(tmp_path, capfd):
    log = tmp_path / "train.log"
    with pytest.raises(RuntimeError), console.quiet_console(log):
        raise RuntimeError("worker died in phase actor_update")
    _, err = capfd.readouterr()
    assert "worker died in phase actor_update" in err and str(log) in err


def test_verbose_keeps_everything_live(tmp_path, capfd):
    with console.quiet_console(tmp_path / "train.log", verbose=True):
        assert not console.is_quiet()
        print("live")
    assert "live" in capfd.readouterr().out


def test_key_metrics_and_bar_postfix():
    m = {"env/bandit/success": 0.5, "env/bandit/format_ok": 1.0, "env/bandit/turns": 1.0, "reward/mean": 0.2,
         "val/env/bandit/success": 0.75, "val/agent/env/x/success": 1.0, "actor/pg_loss": -0.1, "actor/lr": 1e-5,
         "memory/driver_peak_gb": 2.0, "memory/actor_peak_gb": 1.5, "memory/actor_rss_gb": 1.0}
    assert console_metrics(m) == {"env/bandit/success": 0.5, "env/bandit/format_ok": 1.0, "reward/mean": 0.2,
                                  "val/env/bandit/success": 0.75, "actor/pg_loss": -0.1,
                                  "memory/total_peak_gb": 3.5}
    assert bar_postfix(m) == {"reward": "0.200", "success": "0.50", "val": "0.75"}
    assert bar_postfix({**m, "rollout/env_errors": 3.0})["env_errors"] == "3"  # failed episodes show on the step line
    assert console_metrics({"rollout/env_errors": 3.0, "env/bandit/failed": 3.0}) == {"rollout/env_errors": 3.0,
                                                                                        "env/bandit/failed": 3.0}
    two = {"env/a/success": 0.1, "env/b/success": 0.9}
    assert bar_postfix(two) == {"reward": "nan", "success/a": "0.10", "success/b": "0.90"}
