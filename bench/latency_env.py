"""``latency_lake``: FrozenLake 3x3 whose every continuing turn waits a fixed wall time, a stand-in for an agent's
tool call or sandbox (``bench/async_rollout.py``). The wait is in ``legal_actions``, which the agent proxy asks once
per turn that goes on, whatever the model wrote, so a random model's malformed answers pay it too; the sleep holds no
CPU and releases the GIL, as a call waiting on I/O does. Loaded with ``imports=[latency_env]`` (``bench/`` on
``PYTHONPATH``), in the driver and every worker."""

from __future__ import annotations

import time

from ragen.env import register
from ragen.env.frozen_lake import FrozenLakeEnv


@register("latency_lake")
class LatencyLake(FrozenLakeEnv):
    """FrozenLake (``size`` 3 by default, 3 turns) whose ``legal_actions`` first sleeps ``delay_s`` seconds."""

    DEFAULT_MAX_TURN = 3

    def __init__(self, size: int = 3, delay_s: float = 0.5, **kwargs) -> None:  # noqa: ANN003 - FrozenLake's options
        super().__init__(size=size, **kwargs)
        self.delay_s = float(delay_s)

    def legal_actions(self) -> str:
        time.sleep(self.delay_s)
        return super().legal_actions()
