"""Concurrent calls -> batched engine calls (docs/gateway.md).

Programs call the gateway concurrently; the engine samples a batch of prompts at once. :class:`Batcher` queues each
call's prompts, and whenever the engine is free waits a short gather window (``gather_s``) for more calls, then
sends everything queued to the engine in one ``generate`` per distinct set of stop conditions. Calls asking for
different token budgets share a batch: the engine samples up to the largest, and each sample is cut to its own
call's budget afterwards (sampling is autoregressive, so a sample cut after ``m`` tokens is exactly a sample of
``m`` tokens, with the same log-probs; its finish reason becomes ``length``).

The engine is blocking (``ragen.rollout.base.Engine``); it runs on one worker thread, so the event loop keeps
accepting calls while it samples, and the engine never sees two calls at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ragen.rollout.base import Engine, Sample, SamplingParams


@dataclass
class _Job:
    prompts: list[list[int]]
    sampling: SamplingParams
    future: asyncio.Future


def cut_sample(sample: Sample, budget: int) -> Sample:
    """``sample`` cut to at most ``budget`` tokens (finish reason ``length`` when cut)."""
    if len(sample.token_ids) <= budget:
        return sample
    return Sample(sample.token_ids[:budget], sample.log_probs[:budget], "length", dict(sample.extra))


class Batcher:
    """Batches calls for one engine (module docstring). Start with :meth:`start` inside the event loop, end with
    :meth:`stop`; ``engine_calls`` counts the engine's ``generate`` calls, ``pending`` the calls waiting."""

    def __init__(self, engine: Engine, gather_s: float = 0.002) -> None:
        self.engine = engine
        self.gather_s = gather_s
        self.engine_calls = 0
        self._queue: list[_Job] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def pending(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragen-gateway-engine")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for job in self._queue:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the gateway stopped"))
        self._queue = []
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """Samples for ``prompts`` under ``sampling``, from the next batch the engine runs."""
        if self._wake is None:
            raise RuntimeError("the batcher is not started")
        job = _Job([list(p) for p in prompts], sampling, asyncio.get_running_loop().create_future())
        self._queue.append(job)
        self._wake.set()
        return await job.future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            if self.gather_s > 0:
                await asyncio.sleep(self.gather_s)
            jobs, self._queue = self._queue, []
            self._wake.clear()
            groups: dict[SamplingParams, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(dataclasses.replace(job.sampling, max_new_tokens=0), []).append(job)
            for key, group in groups.items():
                budget = max(j.sampling.max_new_tokens for j in group)
                prompts = [p for j in group for p in j.prompts]
                self.engine_calls += 1
                try:
                    samples = await loop.run_in_executor(
                        self._executor, self.engine.generate, prompts, dataclasses.replace(key, max_new_tokens=budget))
                    if len(samples) != len(prompts):
                        raise RuntimeError(f"the engine returned {len(samples)} samples for {len(prompts)} prompts")
                except Exception as exc:  # noqa: BLE001 - the calls of this batch fail, the gateway goes on
                    for j in group:
                        if not j.future.done():
                            j.future.set_exception(exc)
                    continue
                start = 0
                for j in group:
                    mine = samples[start:start + len(j.prompts)]
                    start += len(j.prompts)
                    if not j.future.done():
                        j.future.set_result([cut_sample(s, j.sampling.max_new_tokens) for s in mine])
