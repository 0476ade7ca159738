"""``TrainBatch``: the per-token tensors a worker consumes, with batch-axis slicing helpers.

All tensors are (B, T) and right-padded (the layout of ``ragen.agent.batch.RolloutBatch``). A plain
dataclass of CPU tensors, so it pickles cheaply through Ray's object store.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

_REQUIRED = ("input_ids", "attention_mask", "response_mask")
ROW_FIELDS = ("seq_ids", "seq_tokens")  # (B,) fields; every other tensor field is (B, T)


@dataclass
class TrainBatch:
    """Per-token training tensors, each (B, T).

    input_ids (long); attention_mask (1 on real tokens); response_mask (1 on model-generated tokens, 0 on
    prompt, env observation and padding tokens). Optional, filled in by the driver as phases run:
    old_log_probs / ref_log_probs (float, 0 off the response), advantages / returns (float, 0 off the
    response), values (float, the critic's values before the update), loss_mask (which tokens the
    losses cover; ``None`` means ``response_mask``).

    Per row, shape (B,): seq_ids (long, the sequence, i.e. episode, a row belongs to: the ``turn`` layout's turn
    rows of one episode share it; ``None`` = every row is its own sequence), which the ``seq-mean-*`` loss
    aggregations average over; seq_tokens (float, the loss-token count of the row's sequence in the whole update's
    batch on all ranks; set by ``Trainable.update`` (``trainable.mini_batch_counts``), never by callers).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    values: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    keep_mask: torch.Tensor | None = None
    seq_ids: torch.Tensor | None = None
    seq_tokens: torch.Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        if len(shape) != 2:
            raise ValueError(f"TrainBatch.input_ids must be (B, T), got shape {shape}")
        for f in fields(self):
            t = getattr(self, f.name)
            if t is None:
                if f.name in _REQUIRED:
                    raise ValueError(f"TrainBatch.{f.name} is required")
                continue
            want = shape[:1] if f.name in ROW_FIELDS else shape
            if tuple(t.shape) != want:
                raise ValueError(f"TrainBatch.{f.name} has shape {tuple(t.shape)}, expected {want} like input_ids")

    # ----------------------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def policy_mask(self) -> torch.Tensor:
        """The tokens the policy losses cover: ``loss_mask`` if set, else ``response_mask``. (B, T)."""
        return self.loss_mask if self.loss_mask is not None else self.response_mask

    @property
    def actor_mask(self) -> torch.Tensor:
        """The tokens the actor's PPO loss covers and counts: :attr:`policy_mask` less the tokens rollout
        correction rejected (``keep_mask``; verl's rule: a rejected token is out of the loss and its normaliser).
        (B, T)."""
        mask = self.policy_mask
        return mask if self.keep_mask is None else mask * self.keep_mask.to(mask.dtype)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The non-None fields by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def _map(self, fn) -> TrainBatch:
        return replace(self, **{k: fn(v) for k, v in self.tensors().items()})

    def select(self, index: torch.Tensor | slice | list[int]) -> TrainBatch:
        """Rows ``index`` of every tensor (a slice, a list of row indices or a long / bool tensor)."""
        if isinstance(index, list):
            index = torch.tensor(index, dtype=torch.long)
        return self._map(lambda t: t[index])

    def prompt_order(self) -> list[int]:
        """A row order in which rows with the same prompt are adjacent: prompt groups in order of first appearance,
        rows in their order within a group (the identity when no two rows share a prompt). A row's prompt is its
        tokens before its first response token (all its real tokens when it has none).

        Chunked in this order, a micro-batch holds whole groups of one prompt, and shared-prefix packing
        (``ragen.models.packing``) computes that whole prompt once: on the bandit's two prompt variants (~185
        shared tokens, ~5 own) instead of the ~120 tokens common to both."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for row in range(self.batch_size):
            groups.setdefault(self._prompt_key(row), []).append(row)
        return [row for rows in groups.values() for row in rows]

    def _prompt_key(self, row: int) -> tuple[int, ...]:
        """Row ``row``'s tokens before its first response token (all its real tokens when it has none)."""
        resp = self.response_mask[row].nonzero()
        n = int(resp[0]) if len(resp) else int(self.attention_mask[row].sum())
        return tuple(self.input_ids[row, :n].tolist())

    def prompt_chunks(self, size: int) -> list[TrainBatch]:
        """Consecutive batches of at most ``size`` rows (rows in ``prompt_order()`` first) that never put rows of a
        prompt shared by several rows together with other rows: such a chunk packs its whole prompt once
        (``ragen.models.packing``), where a mixed one shares only the prefix common to all its rows (on the
        bandit ~120 of ~185 prompt tokens: 4-5x the tokens of a one-prompt chunk). Rows whose prompt no other row
        has are chunked together as by :meth:`chunk`. The number of chunks depends on the rows, so sharded workers
        (FSDP, where every rank must run the same number of passes) use :meth:`chunk`."""
        keys = [self._prompt_key(r) for r in range(self.batch_size)]
        count: dict[tuple[int, ...], int] = {}
        for k in keys:
            count[k] = count.get(k, 0) + 1
        bounds, start = [], 0
        for r in range(1, self.batch_size + 1):
            full = r - start == size
            switch = r < self.batch_size and keys[r] != keys[r - 1] and (count[keys[r]] > 1 or count[keys[r - 1]] > 1)
            if r == self.batch_size or full or switch:
                bounds.append((start, r))
                start = r
        return [self.select(slice(a, b)) for a, b in bounds]

    def chunk(self, size: int) -> list[TrainBatch]:
        """Consecutive batches of ``size`` rows (the last one may be smaller)."""
        if size < 1:
            raise ValueError(f"chunk size must be >= 1, got {size}")
        return [self.select(slice(i, i + size)) for i in range(0, self.batch_size, size)]

    def split(self, n: int) -> list[TrainBatch]:
        """``n`` equal consecutive parts (e.g. one per rank); raises if B is not divisible by ``n``."""
        if n < 1 or self.batch_size % n:
            raise ValueError(
                f"cannot split a batch of {self.batch_size} sequences into {n} equal parts; make the batch size "
                f"a multiple of {n} (e.g. rollout batch size or rollout_filter_ratio) or change the world size")
        return self.chunk(self.batch_size // n)

    def with_fields(self, **tensors: torch.Tensor | None) -> TrainBatch:
        """A copy with some fields replaced (e.g. ``batch.with_fields(old_log_probs=lp)``)."""
        return replace(self, **tensors)

    def trim(self) -> TrainBatch:
        """Drop trailing columns that are padding in every row (saves compute on short micro-batches)."""
        real = self.attention_mask.bool().any(dim=0).nonzero()
        length = int(real[-1]) + 1 if len(real) else 1
        return self if length == self.seq_len else self._map(lambda t: t[:, :length] if t.dim() == 2 else t)

    def to(self, device: torch.device | str) -> TrainBatch:
        return self._map(lambda t: t.to(device, non_blocking=True))

    @staticmethod
    def cat(batches: list[TrainBatch]) -> TrainBatch:
        """Concatenate along the batch axis (all parts must have the same fields and T)."""
        if not batches:
            raise ValueError("TrainBatch.cat needs at least one batch")
        names = batches[0].tensors().keys()
        return replace(batches[0], **{k: torch.cat([b.tensors()[k] for b in batches]) for k in names})


def shard_rows(batch_size: int, world_size: int, mini_batch_size: int | None = None,
               order: list[int] | None = None) -> list[torch.Tensor]:
    """Row indices (long tensors) of each rank's part of a batch of ``batch_size`` rows: the one place that decides
    which rows form each global mini-batch, for every world size.

    ``order``: the global row order (default: batch order); the trainer's workers pass ``TrainBatch.prompt_order()``
    (:func:`mini_batch_plan`), so rows sharing a prompt are adjacent and pack their prompt once. With a global
    ``mini_batch_size`` that divides the batch and is a multiple of ``world_size``, the global mini-batches are the
    consecutive blocks of ``mini_batch_size`` rows of ``order`` (as at world size 1) and each is split evenly over
    the ranks: rank r holds positions ``m * mb + r * mb / W ...`` of ``order`` for every mini-batch m, in order. So
    rank r's i-th local mini-batch is its share of the i-th global one and an update sees the same mini-batches at
    every world size (the workers take their rows in the order given and never regroup them). Otherwise (no or
    non-dividing ``mini_batch_size``): ``world_size`` consecutive parts of ``order``.
    """
    if world_size < 1 or batch_size % world_size:
        raise ValueError(f"cannot split {batch_size} rows evenly over {world_size} ranks; make the batch size a "
                         f"multiple of {world_size}")
    rows = torch.arange(batch_size) if order is None else torch.as_tensor(order, dtype=torch.long)
    if sorted(rows.tolist()) != list(range(batch_size)):
        raise ValueError(f"order must be a permutation of the {batch_size} rows")
    mb = mini_batch_size
    if mb is None or mb < 1 or batch_size % mb or mb % world_size:
        return list(rows.view(world_size, -1))
    local = mb // world_size
    return list(rows.view(batch_size // mb, world_size, local).transpose(0, 1).reshape(world_size, -1))


def mini_batch_plan(batch: TrainBatch, world_size: int, mini_batch_size: int | None) -> list[torch.Tensor]:
    """Each rank's rows of ``batch`` (:func:`shard_rows` over ``batch.prompt_order()``): the global mini-batches
    are consecutive blocks of the prompt-ordered rows, identical at every world size, and each rank gets its share
    of every one of them."""
    return shard_rows(batch.batch_size, world_size, mini_batch_size, batch.prompt_order())
