"""Run a command as if on a CPU that is FACTOR times slower at everything: a measured upper bound for a slower machine.

    python scripts/slow_cpu.py 1.75 bash train_ppo_multi_turn.sh
    bash scripts/emulate_avx2.sh python scripts/slow_cpu.py 1.75 bash train_ppo_bilevel.sh   # AVX2-only EPYC

Why: an AVX2-only EPYC we measured ran fp32 GEMM at 49 GFLOP/s (one thread, 1024^2) where the EPYC we develop on runs
86 under ``scripts/emulate_avx2.sh``, so wall times measured under that emulation are a lower bound for such a CPU.
This pauses the command's whole process tree for ``1 - 1/FACTOR`` of every ``--period-ms`` (a duty cycle), so every
thread (GEMM, Python, tokenizer) runs 1/FACTOR of the time and the wall time grows FACTOR x. A real slower CPU
is that much slower on GEMM but usually less on Python and memory-bound work, so wall times measured this way are an
upper bound for it. ``python scripts/slow_cpu.py --calibrate 1.75`` prints the measured slow-down of a 2-thread GEMM
and of a 1-thread Python loop (each ~1.7-2.0 on our EPYC: pausing adds some overhead of its own).

How the tree is paused: a freezer cgroup (cgroup v1 ``/sys/fs/cgroup/freezer`` or v2 ``cgroup.freeze``; needs
root) holds every descendant, including daemons that start their own session (Ray); without one, SIGSTOP/SIGCONT go
to the command's process group.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

V1_FREEZER = Path("/sys/fs/cgroup/freezer")
V2_ROOT = Path("/sys/fs/cgroup")


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Pauser:
    """Pauses and resumes a process tree: a freezer cgroup when one can be made, else the process group."""

    def __init__(self, pid: int):
        self.pid = pid
        self.cgroup: Path | None = None
        self.freeze_file: Path | None = None
        self.values = ("", "")
        name = f"ragen_slow_cpu_{os.getpid()}"
        for root, file, values in ((V1_FREEZER, "freezer.state", ("FROZEN", "THAWED")),
                                   (V2_ROOT, "cgroup.freeze", ("1", "0"))):
            if not (root / "cgroup.procs").exists() or (root is V2_ROOT and V1_FREEZER.exists()):
                continue
            try:
                (root / name).mkdir()
                (root / name / "cgroup.procs").write_text(str(pid))
            except OSError:
                continue
            self.cgroup, self.freeze_file, self.values = root / name, root / name / file, values
            break
        self.how = f"freezer cgroup {self.cgroup}" if self.cgroup else "SIGSTOP/SIGCONT to the process group"

    def pause(self) -> None:
        if self.freeze_file is not None:
            self.freeze_file.write_text(self.values[0])
        else:
            os.killpg(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.freeze_file is not None:
            self.freeze_file.write_text(self.values[1])
        else:
            os.killpg(self.pid, signal.SIGCONT)

    def close(self) -> None:
        try:
            self.resume()
        except OSError:
            pass
        if self.cgroup is not None:
            for _ in range(50):  # the cgroup can be removed once its processes have exited
                try:
                    self.cgroup.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def run_slowed(command: list[str], factor: float, period_ms: float, stdout=None) -> int:
    """Run ``command`` paused for ``1 - 1/factor`` of each period; returns its exit code."""
    if factor < 1.0:
        raise SystemExit(f"slow_cpu: FACTOR must be >= 1 (got {factor}); 1.75 = a CPU at 49 of 86 GFLOP/s fp32 GEMM")
    proc = subprocess.Popen(command, start_new_session=True, stdout=stdout)
    pauser = Pauser(proc.pid)
    print(f"[slow_cpu] x{factor:g}: pid {proc.pid} runs {100 / factor:.0f}% of every {period_ms:g} ms "
          f"({pauser.how})", file=sys.stderr, flush=True)
    run_s, stop_s = period_ms / 1000 / factor, period_ms / 1000 * (1 - 1 / factor)

    def stop(signum: int, _frame: object) -> None:  # never leave the command frozen behind us
        raise _Stopped(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    try:
        while proc.poll() is None:
            time.sleep(run_s)
            if stop_s > 0:
                pauser.pause()
                try:
                    time.sleep(stop_s)
                finally:
                    pauser.resume()
    except _Stopped as exc:
        pauser.resume()
        os.killpg(proc.pid, exc.signum)
        proc.wait()
    finally:
        pauser.close()
    return proc.returncode


GEMM = ("import time, torch; torch.set_num_threads(2); a = torch.randn(1024, 1024); a @ a; t = time.perf_counter()\n"
        "for _ in range(400): a @ a\nprint(time.perf_counter() - t)")
PYLOOP = ("import time; t = time.perf_counter(); s = sum(i * i for i in range(20_000_000)); "
          "print(time.perf_counter() - t)")


def calibrate(factor: float, period_ms: float) -> None:
    """Print each probe's seconds alone and slowed, and their ratio (should be ~factor)."""
    for name, code in (("GEMM 1024^2 x400, 2 threads", GEMM), ("Python loop, 1 thread", PYLOOP)):
        alone = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
        with tempfile.TemporaryFile("w+") as fh:
            run_slowed([sys.executable, "-c", code], factor, period_ms, stdout=fh)
            fh.seek(0)
            slowed = float(fh.read() or "nan")
        print(f"{name}: alone {alone:.2f} s, slowed {slowed:.2f} s, ratio {slowed / alone:.2f} (target {factor:g})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("factor", type=float, help="slow-down, e.g. 1.75 (86 / 49 GFLOP/s)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    parser.add_argument("--period-ms", type=float, default=20.0, help="duty-cycle period (default 20 ms)")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure the slow-down on two probes instead (options go before FACTOR)")
    args = parser.parse_args()
    if args.calibrate:
        calibrate(args.factor, args.period_ms)
        return
    if not args.command:
        parser.error("give a command to run, e.g. python scripts/slow_cpu.py 1.75 bash train_ppo.sh")
    sys.exit(run_slowed(args.command, args.factor, args.period_ms))


if __name__ == "__main__":
    main()
