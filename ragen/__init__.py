"""ragen: training LLM agents with multi-turn reinforcement learning."""

import os as _os

# OpenMP threads that finish a parallel region spin-wait for the next one by default. When another process computes
# on the same cores (a second run, a Ray worker, the test suite) those spinning threads take the cores from it
# (bench/omp_wait_policy.py on 2 cores: beside one competing process passive is 1.49x faster, alone 8% slower; with
# real training jobs beside it 20-37 s vs 8-9 s). Set before torch loads its OpenMP runtime (importing ragen first,
# as every entry point does); a value the user exported wins (OMP_WAIT_POLICY=ACTIVE on a dedicated machine).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Large tensors are reused from glibc's heap instead of being mapped and faulted in afresh on every micro-batch
# (ragen.allocator.tune_allocator; RAGEN_TUNE_MALLOC=0 or any MALLOC_* / GLIBC_TUNABLES variable turns it off).
from ragen.allocator import tune_allocator as _tune_allocator  # noqa: E402

ALLOCATOR_TUNED = _tune_allocator()

__version__ = "0.1.0"
