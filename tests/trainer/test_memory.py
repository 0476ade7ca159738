"""Memory: every process reports its RSS each step, stays under a cap, and does not grow from step to step (a
leak would: e.g. state dicts or rollouts kept alive across steps), and each phase its own. Tiny model, Ray workers,
multi-turn episodes."""

import mmap
import os

import pytest
from trainer_helpers import PROCESSES, read_metrics, rss_without_growth, tiny_overrides

from ragen.launch import run
from ragen.trainer.config.compose import load_train_config
from ragen.utils.memory import memory_stats, peak_rss_gb, release_free_memory, rss_gb

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

CAP_GB = 4.0  # per process, tiny model (the default model's budget is in bench/train_step.py and the README)


def test_memory_helpers_read_this_process():
    # A fresh anonymous mapping, not a bytearray: ragen's allocator tuning serves even 200 MiB from glibc's heap, which
    # may reuse pages an earlier test left resident, so RSS would not move.
    before = rss_gb()
    block = mmap.mmap(-1, 200 * 1024 * 1024)  # 200 MiB, every page touched below
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    assert rss_gb() > before + 0.15 and peak_rss_gb() >= rss_gb() - 1e-3
    block.close()
    release_free_memory()
    assert set(memory_stats()) == {"rss_gb", "peak_gb"}


def test_three_multi_turn_steps_stay_under_a_cap_without_growth(tmp_path):
    overrides = [*tiny_overrides(tmp_path, 3), "trainer.use_ray=true", "trainer.val_before_train=false",
                 "trainer.val_freq=0", "trainer.save_freq=0"]
    run(load_train_config("ppo_multi_turn", overrides))
    records = [r for r in read_metrics(tmp_path) if "memory/driver_rss_gb" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    rss = rss_without_growth(records)
    for proc in PROCESSES:
        peak = records[-1][f"memory/{proc}_peak_gb"]
        assert 0.05 < max(rss[proc]) < CAP_GB and peak < CAP_GB, (proc, rss[proc], peak)
    # each phase's memory, recorded where it runs (Ray workers, the driver) and collected with the step's metrics
    for phase in ("rollout", "actor_log_probs", "critic_values", "critic_update", "actor_update", "weight_sync"):
        assert 0.05 < records[-1][f"memory/{phase}/rss"] < CAP_GB, phase
    driver_nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert records[-1]["memory/actor_nice"] == records[-1]["memory/critic_nice"] == driver_nice  # not Ray's 15


def test_workers_take_the_driver_niceness(tmp_path, subprocess_env):
    """Ray starts workers at niceness 15; match_driver_priority moves a process to $RAGEN_DRIVER_NICE (raising it
    needs no privilege, lowering it does)."""
    import subprocess
    import sys

    code = ("import os; os.nice(5); from ragen.utils.process import match_driver_priority; "
            "os.environ['RAGEN_DRIVER_NICE'] = '{}'; print(match_driver_priority())")
    for target in (8, 2):
        out = subprocess.run([sys.executable, "-c", code.format(target)], env=subprocess_env, capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()[-1]
        start = os.getpriority(os.PRIO_PROCESS, 0) + 5
        expected = target if target >= start or os.geteuid() == 0 else start
        assert int(out) == expected, (target, out)
