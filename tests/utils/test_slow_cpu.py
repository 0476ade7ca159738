"""scripts/slow_cpu.py runs a command paused for 1 - 1/FACTOR of every period (a slower-CPU emulation)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slow_cpu.py"

# Spins for 1.5 s of wall time and prints the share of it spent in gaps > 10 ms between consecutive clock reads,
# i.e. while the process was paused (an unpaused spin loop reads the clock every microsecond or so).
GAPS = """
import time
start = last = time.monotonic()
paused = 0.0
while last - start < 1.5:
    now = time.monotonic()
    if now - last > 0.010:
        paused += now - last
    last = now
print(paused / (last - start))
"""


def _slowed(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, **kwargs)


def test_the_command_is_paused_for_its_share_of_each_period():
    # Other processes on the machine also take the spinning command off the CPU: compare its running share with
    # the same loop's share run directly, just before (factor 2 halves it; alone, directly, the share is ~1).
    direct = subprocess.run([sys.executable, "-c", GAPS], capture_output=True, text=True, timeout=60)
    out = _slowed("--period-ms", "60", "2", sys.executable, "-c", GAPS)
    assert out.returncode == 0, out.stderr
    running, running_direct = 1 - float(out.stdout), 1 - float(direct.stdout)
    assert 0.3 < running / running_direct < 0.7, (out.stdout, direct.stdout)


def test_exit_code_and_output_pass_through():
    out = _slowed("3", "sh", "-c", "echo hello; exit 3")
    assert (out.returncode, out.stdout) == (3, "hello\n")
    assert "x3: pid" in out.stderr


def test_factor_below_one_is_refused_with_the_fix():
    out = _slowed("0.5", "true")
    assert out.returncode != 0 and "FACTOR must be >= 1" in out.stderr


def test_terminating_it_resumes_and_ends_the_command():
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--period-ms", "40", "4", "sleep", "60"],
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()  # "[slow_cpu] x4: pid N runs ..."
    child = int(line.split("pid ")[1].split()[0])
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the paused command outlived slow_cpu.py"
    leftovers = list(Path("/sys/fs/cgroup/freezer").glob(f"ragen_slow_cpu_{proc.pid}"))
    assert leftovers == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"
