"""ragen: training LLM agents with multi-turn reinforcement learning."""

import os as _os

# OpenMP threads that finish a parallel region spin-wait for the next one by default. When another process computes
# on the same cores (a second run, a Ray worker, the test suite) those spinning threads take the cores from it: on a
# 2-core machine a 32-prompt generation took 20-37 s with 2 spinning threads beside one other job and 8-9 s with
# passive waits. Set before torch loads its OpenMP runtime (importing ragen first, as every entry point does); a
# value the user exported wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
