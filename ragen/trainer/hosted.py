"""The driver's handle on the rollout engines the actor's ranks host (``ragen.workers.engine_host``).

:class:`HostedEngines` implements the ``Engine`` protocol (``ragen.rollout.base``) over the actor group, so the agent
proxies, the step's sleep / wake and the weight sync talk to it as to one engine:

- ``generate`` splits one call's prompts into contiguous shares, one per hosting rank, as even as they can be
  (:func:`share_bounds`: sizes differ by at most one, the larger ones first), runs the shares at once and
  concatenates the samples in prompt order. Share k samples with seed :func:`share_seed` (seed, k): share 0 keeps
  the call's seed, so one hosting rank samples exactly what one engine in the driver would; the others get
  distinct seeds (no two shares draw the same random stream, and none collides with the proxy's next-turn seed,
  which is the call's seed + 1). A rank whose share is empty is not called.
- ``sleep`` / ``wake`` / ``ensure_awake`` go to every rank; each rank's engine keeps its own sleep state, and
  ``asleep`` asks rank 0's (the ranks sleep and wake together).
- ``sync_weights`` has every rank gather and load its engine's weights in place; the driver receives a summary of
  three numbers per rank (``tensors``, ``bytes``, ``seconds``), never a tensor. ``update_weights`` (weights held
  by the driver) is refused: nothing outside the actor's ranks holds the weights the hosted engines need.

An episode's next turn goes to whichever rank its position in that turn's prompt list falls to: when earlier
episodes have finished, it may move to another rank, where its prompt is prefilled whole instead of extending the
kept KV cache (the hf engine's ``prefix_cache``, vLLM's prefix cache). Shares stay balanced at the cost of those
cache hits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SEED_MIX = 0x9E3779B97F4A7C15  # 64-bit golden-ratio constant (splitmix64) spreading (seed, share) over 63 bits


def share_bounds(n: int, shares: int) -> list[tuple[int, int]]:
    """[start, stop) of each of ``shares`` contiguous shares of ``n`` items: sizes ``ceil`` then ``floor`` of
    n / shares (differing by at most one), in order, covering 0..n exactly once."""
    if shares < 1:
        raise ValueError(f"need at least one share, got {shares}")
    base, extra = divmod(n, shares)
    bounds, start = [], 0
    for k in range(shares):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def share_seed(seed: int | None, share: int) -> int | None:
    """The seed share ``share`` of a call seeded ``seed`` samples with: ``seed`` itself for share 0 (one hosting
    rank reproduces a single engine), else a 63-bit mix of (seed, share) (splitmix64's finaliser), which no small
    offset of another call's seed reaches in practice. None stays None (the engines' own randomness)."""
    if seed is None or share == 0:
        return seed
    z = (int(seed) + share * SEED_MIX) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) % (2**63 - 1)


class HostedEngines:
    """The ``Engine`` protocol over the engines hosted by ``group``'s ranks (a ``WorkerGroup`` or
    ``LocalWorkerGroup`` of ``PolicyWorker``\\ s built with ``engine=...``); see the module docstring."""

    def __init__(self, group: Any):
        self.group = group
        self.last_sync: dict[str, float] = {}

    def rebind(self, group: Any) -> None:
        """Drive the engines of a rebuilt actor group (``ragen.ppo.restarts``); the agent proxies keep this
        handle."""
        self.group = group

    @property
    def ranks(self) -> int:
        return int(self.group.world_size)

    def generate(self, prompt_token_ids: list[list[int]], sampling: Any) -> list[Any]:
        """One sample per prompt, in prompt order: contiguous shares played by the ranks at once."""
        bounds = share_bounds(len(prompt_token_ids), self.ranks)
        args: list[tuple | None] = [
            (prompt_token_ids[a:b], dataclasses.replace(sampling, seed=share_seed(sampling.seed, k))) if b > a
            else None
            for k, (a, b) in enumerate(bounds)]
        results = self.group.call_each("engine_generate", args)
        samples: list[Any] = []
        for (a, b), got in zip(bounds, results, strict=True):
            got = got or []
            if len(got) != b - a:
                raise RuntimeError(f"a hosted engine returned {len(got)} samples for {b - a} prompts")
            samples.extend(got)
        return samples

    @property
    def asleep(self) -> frozenset[str]:
        """The parts asleep now, as rank 0's engine records them (every call goes to all ranks alike)."""
        return frozenset(self.group.call_rank0("engine_asleep"))

    def sleep(self) -> None:
        self.group.call("engine_sleep")

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        self.group.call("engine_wake", tags=None if tags is None else tuple(tags))

    def ensure_awake(self) -> None:
        self.wake(None)

    def sync_weights(self) -> dict[str, float]:
        """Every rank loads the actor's current weights into its engine (``PolicyWorker.sync_engine_weights``);
        returns the mean over ranks of ``tensors``, ``bytes`` and ``seconds``."""
        self.last_sync = self.group.call("sync_engine_weights")
        return self.last_sync

    def update_weights(self, state_dict: Any) -> None:
        raise TypeError("hosted engines get their weights from the actor's ranks (sync_weights), not from weights "
                        "held by the driver")
