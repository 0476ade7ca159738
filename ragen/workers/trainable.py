"""The PPO update machinery shared by the policy and critic workers (composition, not a base class).

``Trainable`` owns a (possibly FSDP2-sharded) module, its AdamW optimizer and lr schedule, and runs
``update``: for each of ``ppo_epochs`` passes, for each mini-batch (``mini_batch_size`` sequences globally,
``mini_batch_size / world_size`` on this rank: ``WorkerGroup`` hands each rank its share of every global
mini-batch, in order, so the mini-batches are those of world size 1), gradients of the micro-batches
(``micro_batch_size`` rows each, trailing padding trimmed) accumulate, then the global grad norm is clipped and
one optimizer + lr step runs. Losses are normalised by token / sequence counts all-reduced over the whole
mini-batch, so the summed micro-batch losses are the mini-batch loss whatever the micro-batch split or world size.
Between phases the parameters, gradients and optimizer state can leave the device (``offload`` / ``reload``,
``ragen.workers.offload``) while a colocated rollout engine uses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ragen.utils.memory import release_cached_memory
from ragen.workers import dist as D
from ragen.workers.data import TrainBatch
from ragen.workers.offload import StateOffload

OPTIM_FILE = "optimizer.pt"


def lr_multiplier(step: float, *, warmup_steps: int, schedule: str, total_steps: int | None,
                  min_lr_ratio: float) -> float:
    """lr / base lr at optimizer step ``step`` (0-based; a fractional position between two steps is allowed, see
    ``Trainable.update``'s ``progress``): linear warmup, then constant or cosine decay.

    Warmup: (step + 1) / warmup_steps for step < warmup_steps. Cosine: min_lr_ratio + (1 - min_lr_ratio) *
    0.5 * (1 + cos(pi * p)), p = (step - warmup) / (total - warmup) clipped to [0, 1].
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, (total_steps or 1) - warmup_steps)
    p = min(1.0, max(0.0, (step - warmup_steps) / span))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


@dataclass
class MicroResult:
    """What a micro-batch loss function returns: the loss to backprop (its share of the mini-batch loss) and
    token-weighted metric sums (``sum over this micro-batch's masked tokens of the per-token metric``) plus
    plain sums (e.g. the loss share itself), all divided later by the global totals."""

    loss: torch.Tensor
    token_sums: dict[str, float]
    sums: dict[str, float]


MicroLossFn = Callable[[TrainBatch, float, float], MicroResult]
"""(micro_batch, mini-batch token count, mini-batch sequence count) -> MicroResult."""


class Trainable:
    """A module with AdamW + lr schedule and the mini/micro-batch update loop (see module docstring)."""

    def __init__(self, module: nn.Module, cfg, device: torch.device, world_size: int, prefix: str,
                 lr_by_prefix: dict[str, float] | None = None):
        """``lr_by_prefix``: base learning rates of the parameters whose names start with a prefix (their own AdamW
        group, same schedule), e.g. ``{"value_head.": 1e-5}``; the rest use ``cfg.lr`` (a LoRA actor's adapters
        too)."""
        self.module, self.cfg, self.device, self.world_size, self.prefix = module, cfg, device, world_size, prefix
        if cfg.lr_schedule == "cosine" and not cfg.total_steps:
            raise ValueError(f"{prefix}.lr_schedule='cosine' needs {prefix}.total_steps >= 1 (optimizer steps), got "
                             f"{cfg.total_steps}; the trainer derives it from trainer.total_steps "
                             "(ragen.trainer.config.run_shape.worker_total_steps), direct worker users must set it")
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        lr = cfg.lr
        groups: dict[float, list[nn.Parameter]] = {}
        for n, p in named:
            own = [v for k, v in (lr_by_prefix or {}).items() if n.startswith(k)]
            groups.setdefault(own[0] if own else lr, []).append(p)
        self.optimizer = torch.optim.AdamW([{"params": ps, "lr": g} for g, ps in groups.items()], lr=lr,
                                           betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.steps = 0
        self.offloader = StateOffload(module, self.optimizer, device)

    def offload(self, params: bool = True, optimizer: bool = True) -> None:
        """Move the parameters (with their gradients) and / or the optimizer state to host memory
        (``StateOffload.offload``); a no-op that records the call on a CPU device."""
        self.offloader.offload(params=params, optimizer=optimizer)

    def reload(self) -> None:
        """Bring back everything :meth:`offload` moved, bitwise as it was."""
        self.offloader.reload()

    def _lr_lambda(self, step: int) -> float:
        c = self.cfg
        return lr_multiplier(step, warmup_steps=c.warmup_steps, schedule=c.lr_schedule, total_steps=c.total_steps,
                             min_lr_ratio=c.min_lr_ratio)

    def _progress_multiplier(self, fraction: float) -> float:
        """lr / base lr at ``fraction`` of the run's updates: warmup by optimizer steps taken, then the decay at
        position ``fraction * total_steps`` of its horizon (see ``update``'s ``progress``)."""
        c = self.cfg
        position = self.steps if self.steps < c.warmup_steps else fraction * (c.total_steps or 1)
        return lr_multiplier(position, warmup_steps=c.warmup_steps, schedule=c.lr_schedule,
                             total_steps=c.total_steps, min_lr_ratio=c.min_lr_ratio)

    def _set_lr(self, multiplier: float) -> float:
        """Every group's rate = its base rate x ``multiplier``; returns the first group's."""
        for g in self.optimizer.param_groups:
            g["lr"] = g["initial_lr"] * multiplier
        return float(self.optimizer.param_groups[0]["lr"])

    def local_mini_batch_size(self, local_batch: int) -> int:
        """Rows per mini-batch on this rank; raises with the fix when the sizes do not divide."""
        mb, ws, p = self.cfg.mini_batch_size, self.world_size, self.prefix
        if mb % ws:
            raise ValueError(f"{p}.mini_batch_size={mb} must be divisible by the world size {ws}")
        local = mb // ws
        if local_batch % local:
            raise ValueError(f"{p}: the batch ({local_batch * ws} sequences over {ws} ranks) is not divisible by "
                             f"{p}.mini_batch_size={mb}; make the train batch size a multiple of it")
        return local

    def update(self, batch: TrainBatch, mask_fn: Callable[[TrainBatch], torch.Tensor],
               micro_loss: MicroLossFn, epochs: int | None = None, lr: float | None = None,
               lr_end: float | None = None, progress: tuple[int, int] | None = None) -> dict[str, float]:
        """Run the update (``epochs`` passes, default ``ppo_epochs``); ``mask_fn`` gives the loss mask of a
        batch (for the global counts). ``lr``: a fixed learning rate for this update only (the warm start),
        which neither reads nor advances the lr schedule; with ``lr_end`` the rate goes linearly from ``lr``
        (first optimizer step) towards ``lr_end`` (the rate one step after the last: optimizer step i of n uses
        ``lr + (lr_end - lr) * i / n``), so consecutive calls can continue one decay.
        ``progress``: ``(u, U)``, this is the run's update u of U (0-based; the trainer passes its RL step), and the
        schedule follows the run's fraction rather than the optimizer steps taken: optimizer step i of this update's
        n sits at ``total_steps * (u + i / n) / U`` of the schedule's horizon, and after the update the rate is the
        schedule's at ``(u + 1) / U``, so the last update leaves it at ``min_lr_ratio`` however many mini-batches
        each update had (the ``turn`` layout's row count varies; ``total_steps`` is its upper bound). Where every
        update has the same n (the trajectory layout) this is the per-optimizer-step schedule exactly. Warmup counts
        optimizer steps either way.

        Rows are taken in the order given: the worker group decides the global mini-batches (prompt order, the same
        at every world size: ``ragen.workers.data.mini_batch_plan``), this rank's i-th block of
        ``mini_batch_size / world_size`` rows is its share of the i-th one. A mini-batch without a single loss token
        on any rank (e.g. only the ``turn`` layout's padding rows, or only failed episodes) runs no forward, no
        optimizer step and no lr-schedule step: the decision uses the all-reduced token count, so all ranks skip
        together, and Adam's momentum never moves the weights on a batch of nothing.

        Returns metrics averaged over optimizer steps (identical on every rank): ``<prefix>/grad_norm``,
        ``<prefix>/lr``, every ``sums`` key averaged over mini-batches and every ``token_sums`` key divided by
        the mini-batch token counts; ``<prefix>/empty_mini_batches`` counts the skipped mini-batches.
        """
        self.module.train()
        local_mb = self.local_mini_batch_size(batch.batch_size)
        token_acc: dict[str, float] = {}
        sum_acc: dict[str, float] = {}
        fixed_lr = lr
        scheduled = [g["lr"] for g in self.optimizer.param_groups]
        if lr_end is not None and fixed_lr is None:
            raise ValueError("lr_end needs lr (a fixed rate to decay from)")
        if progress is not None and progress[1] < 1:
            raise ValueError(f"progress={progress}: the run's update count must be >= 1")
        n_epochs = self.cfg.ppo_epochs if epochs is None else epochs
        minis = batch.chunk(local_mb)
        counts = mini_batch_counts(minis, mask_fn, self.device)
        real = [(mini if c[2] is None else mini.with_fields(seq_tokens=c[2]), c[:2])
                for mini, c in zip(minis, counts, strict=True) if c[0] > 0]
        n_total = n_epochs * len(real)
        total_tokens, grad_norms, n_mini, lr = 0.0, [], 0, fixed_lr or self.scheduler.get_last_lr()[0]
        for _ in range(n_epochs):
            for mini, (n_tok, n_seq) in real:
                if fixed_lr is not None:
                    lr = fixed_lr if lr_end is None else fixed_lr + (lr_end - fixed_lr) * n_mini / n_total
                    for g in self.optimizer.param_groups:
                        g["lr"] = lr
                elif progress is not None:
                    lr = self._set_lr(self._progress_multiplier((progress[0] + n_mini / n_total) / progress[1]))
                total_tokens += n_tok
                for micro in _micro_chunks(mini, self.cfg.micro_batch_size):
                    res = micro_loss(micro.trim().to(self.device), n_tok, n_seq if n_seq > 0 else 1.0)
                    # FSDP2 averages gradients over ranks; the loss is already normalised globally -> sum.
                    (res.loss * self.world_size).backward()
                    for k, v in res.token_sums.items():
                        token_acc[k] = token_acc.get(k, 0.0) + v
                    for k, v in res.sums.items():
                        sum_acc[k] = sum_acc.get(k, 0.0) + v
                if fixed_lr is None and progress is None:
                    lr = self.scheduler.get_last_lr()[0]
                grad_norms.append(self._step(schedule=fixed_lr is None))
                n_mini += 1
        if fixed_lr is not None:  # a fixed rate was for this call only: the schedule's rate comes back
            for g, value in zip(self.optimizer.param_groups, scheduled, strict=True):
                g["lr"] = value
        elif progress is not None:
            self._set_lr(self._progress_multiplier((progress[0] + 1) / progress[1]))
        keys_t, keys_s = sorted(token_acc), sorted(sum_acc)
        reduced = D.all_reduce_sum([token_acc[k] for k in keys_t] + [sum_acc[k] for k in keys_s], self.device)
        metrics = {k: v / max(total_tokens, 1.0) for k, v in zip(keys_t, reduced[:len(keys_t)], strict=True)}
        metrics.update({k: v / max(n_mini, 1) for k, v in zip(keys_s, reduced[len(keys_t):], strict=True)})
        finite = [g for g in grad_norms if math.isfinite(g)]
        metrics[f"{self.prefix}/grad_norm"] = sum(finite) / max(len(finite), 1)
        metrics[f"{self.prefix}/skipped_steps"] = float(len(grad_norms) - len(finite))
        metrics[f"{self.prefix}/empty_mini_batches"] = float(n_epochs * (len(minis) - len(real)))
        metrics[f"{self.prefix}/lr"] = float(lr)
        self.module.eval()
        release_cached_memory()  # the micro-batches' activations: back to the OS / CUDA driver, not kept at the peak
        return metrics

    def _step(self, schedule: bool = True) -> float:
        """Clip, step (skipped when the grad norm is not finite), schedule; returns the pre-clip norm."""
        norm = D.clip_grad_norm(self.params, self.cfg.grad_clip)
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if schedule:
            self.scheduler.step()
            self.steps += 1
        return norm

    def reset_optimizer(self) -> None:
        """Forget the optimizer's moments and step counts (e.g. after a warm start, before RL)."""
        self.optimizer.state.clear()

    # ----------------------------------------------------------------------------------------------
    def save_state(self, directory: Path, rank: int) -> None:
        """Write optimizer (full, unsharded) + scheduler + step counter to ``directory/optimizer.pt`` (rank 0)."""
        optim = D.optimizer_full_state(self.module, self.optimizer)
        if rank == 0:
            state = {"optimizer": optim, "scheduler": self.scheduler.state_dict(), "steps": self.steps}
            torch.save(state, directory / OPTIM_FILE)

    def load_state(self, directory: Path) -> None:
        """Inverse of ``save_state`` (any world size; every rank reads the file)."""
        path = directory / OPTIM_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; expected a checkpoint written by the worker's save()")
        state = torch.load(path, map_location="cpu", weights_only=False)
        D.load_optimizer_full_state(self.module, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])


def mini_batch_counts(minis: list[TrainBatch], mask_fn: Callable[[TrainBatch], torch.Tensor], device: torch.device
                      ) -> list[tuple[float, float, torch.Tensor | None]]:
    """The loss normalisers of each mini-batch of one update, summed over ranks: (loss tokens, sequences, per-row
    ``seq_tokens`` or None). ``minis``: this rank's mini-batches in order (the i-th is its share of global mini-batch
    i); ``mask_fn(mini)``: (b, T) the tokens the loss covers.

    Without ``seq_ids`` a sequence is a row: each mini-batch counts its rows with a loss token (one all-reduce).
    With them (the ``turn`` layout: a sequence is an episode, ``seq_ids`` its id) an episode's turn rows can fall
    into several mini-batches (rows are packed in prompt order), so a mini-batch holds a share of an episode, not a
    whole one. Each row's ``seq_tokens`` is then its episode's loss tokens over the whole batch (so a
    ``seq-mean-token-mean`` piece is its share of the episode's token mean), and every mini-batch's sequence count
    is the same, N / M: the batch's N episodes over its M mini-batches with a loss token. Summed over an update's
    mini-batches every episode then weighs M / N, however its rows were cut (1 / N per sequence and mini-batch, as
    in the trajectory layout, where M / N = 1 / episodes per mini-batch).
    """
    if not minis or minis[0].seq_ids is None:
        local: list[float] = []
        for mini in minis:
            mask = mask_fn(mini)
            local += [float(mask.sum()), float(mask.bool().any(-1).sum())]
        total = D.all_reduce_sum(local, device) if local else []
        return [(total[2 * i], total[2 * i + 1], None) for i in range(len(minis))]
    width = int(D.all_reduce_max(max(float(m.seq_ids.max()) for m in minis), device)) + 1
    per_seq = torch.cat([torch.bincount(m.seq_ids.long(), weights=mask_fn(m).sum(-1).double(), minlength=width)
                         for m in minis])
    per_seq = torch.tensor(D.all_reduce_sum(per_seq.tolist(), device), dtype=torch.float64).view(len(minis), width)
    episode_tokens = per_seq.sum(0)
    tokens = per_seq.sum(1)
    n_episodes, n_minis = float((episode_tokens > 0).sum()), float((tokens > 0).sum())
    seqs = n_episodes / n_minis if n_minis else 0.0
    return [(float(tokens[i]), seqs, episode_tokens[mini.seq_ids.long()].float()) for i, mini in enumerate(minis)]


def _in_prompt_order(batch: TrainBatch) -> tuple[TrainBatch, torch.Tensor | None]:
    """(``batch`` with rows in ``prompt_order()``, the inverse permutation), or (``batch``, None) when the order is
    already the identity."""
    order = batch.prompt_order()
    if order == list(range(batch.batch_size)):
        return batch, None
    perm = torch.tensor(order, dtype=torch.long)
    return batch.select(perm), torch.argsort(perm)


def _micro_chunks(batch: TrainBatch, size: int) -> list[TrainBatch]:
    """Micro-batches of ``batch``: one prompt per chunk where rows share prompts (``TrainBatch.prompt_chunks``), or
    plain ``chunk`` under FSDP, whose ranks must all run the same number of passes."""
    return batch.chunk(size) if D.is_sharded() else batch.prompt_chunks(size)


def forward_in_chunks(batch: TrainBatch, size: int, device: torch.device, fn: Callable) -> Any:
    """Apply ``fn`` to chunks of ``size`` rows with trailing padding trimmed, under no_grad, and reassemble CPU
    float32 tensors: ``fn`` returns a (b, t) tensor, or a tuple of (b, t) and (b,) tensors; (b, t) outputs come
    back as (B, T) with zeros in the trimmed columns, (b,) outputs as (B,). Outputs are in ``batch``'s row order;
    the chunks are cut in ``batch.prompt_order()``, one shared prompt per chunk (``_micro_chunks``)."""
    batch, inverse = _in_prompt_order(batch)
    parts: list[tuple[torch.Tensor, ...]] = []
    single = True
    with torch.no_grad():
        for part in _micro_chunks(batch, size):
            small = part.trim()
            res = fn(small.to(device))
            single = isinstance(res, torch.Tensor)
            outs = (res,) if single else tuple(res)
            parts.append(tuple(F.pad(o.float().cpu(), (0, batch.seq_len - small.seq_len)) if o.dim() == 2
                               else o.float().cpu() for o in outs))
    if not parts:
        return torch.zeros(0, batch.seq_len)
    merged = tuple(torch.cat(xs) for xs in zip(*parts, strict=True))
    if inverse is not None:
        merged = tuple(x[inverse] for x in merged)
    return merged[0] if single else merged
