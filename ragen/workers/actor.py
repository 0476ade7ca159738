"""Policy worker: the actor (PPO updates) or the frozen reference policy, one instance per rank.

With ``cfg.lora_rank > 0`` the actor trains LoRA adapters on a frozen base (``ragen.workers.lora``) and is its own
reference (``compute_ref_log_probs``: adapters off); rollout engines and checkpoints get merged weights.

Each rank holds an FSDP2 shard of the causal LM (world size 1: the plain module) wrapped in
``LogProbModel`` so one root forward computes chunked token log-probs. The batch a worker receives is its
rank-local shard (``WorkerGroup`` splits the global batch). Loss (``ragen.algorithms.losses``):
  policy_loss(clip-higher, dual clip) - entropy_coef * entropy + kl_loss_coef * KL(pi || pi_ref) [if use_kl_loss]
each aggregated with ``loss_agg`` over the policy mask with mini-batch-global counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from ragen.algorithms.losses import bc_loss, entropy_loss, kl_estimate, kl_loss, policy_loss, value_loss
from ragen.models.attention import resolve_attn_implementation
from ragen.models.value_head import HEAD_FILE, zero_value_head
from ragen.models.weights import MemoryReader, SafetensorsReader, TensorReader
from ragen.utils.console import redirect_worker_output
from ragen.utils.hardware import resolve_precision
from ragen.utils.memory import PHASE_MEMORY, PhasePeaks, memory_stats
from ragen.utils.process import location, match_driver_priority, niceness
from ragen.workers import dist as D
from ragen.workers import materialize as M
from ragen.workers.collapse_probe import cross_log_probs
from ragen.workers.config import ActorConfig, SharedValueHead
from ragen.workers.data import TrainBatch
from ragen.workers.engine_host import EngineHost, EngineSpec, gathered
from ragen.workers.logprob import LogProbModel
from ragen.workers.lora import (
    ADAPTER_FILE,
    adapter_names,
    adapter_state,
    adapters_disabled,
    add_lora,
    initial_adapters,
    is_adapter_key,
    merge_lora_stream,
    merge_weight,
    plain_name,
)
from ragen.workers.offload import StateOffload, worker_phase
from ragen.workers.trainable import MicroResult, Trainable, forward_in_chunks

ROLES = ("actor", "ref")


def lm_names(module: LogProbModel, reader: TensorReader) -> dict[str, str]:
    """{module name: name in ``reader``} of the causal LM's weights in ``module`` (a LoRA base weight under its plain
    name; with or without the base model's prefix, ``ragen.workers.materialize.checkpoint_names``)."""
    names = [n for group, _ in M.module_tensors(module) for n in group]
    return M.checkpoint_names(names, reader.keys(), prefix="lm.", base_prefix=f"{module.lm.base_model_prefix}.",
                              rename=plain_name)


def adapter_names_of_a(a_name: str) -> tuple[str, str]:
    """(the base weight's name, B's name) of a LoRA A weight's name (``<m>.lora_A.<adapter>.weight``)."""
    prefix, rest = a_name.split(".lora_A.", 1)
    return f"{prefix}.base_layer.weight", f"{prefix}.lora_B.{rest}"


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view: writes reach the parameter), or ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def weight_dtype(role: str, mixed_precision: str, device: torch.device) -> torch.dtype:
    """The dtype a policy worker holds its weights in: fp32 master weights for the actor (its optimizer updates
    them); the reference policy, which has no optimizer, in its compute precision: bf16 where
    ``resolve_precision(mixed_precision, device)`` gives bf16, else fp32."""
    if role == "ref" and resolve_precision(mixed_precision, device)[0] == "bf16":
        return torch.bfloat16
    return torch.float32


def policy_objective(cfg: ActorConfig, log_probs: torch.Tensor, entropy: torch.Tensor, b: TrainBatch,
                     num_tokens: float, num_seqs: float) -> tuple[torch.Tensor, dict[str, float], dict[str, float]]:
    """The actor's loss on one micro-batch ``b`` and its metric sums: (loss, token_sums, sums) as in ``MicroResult``.

    loss = ``policy_loss`` (PPO clip with ``cfg.clip_low`` / ``clip_high`` / ``dual_clip``, Schulman et al. 2017
    eq. 7; DAPO's clip-higher) - ``cfg.entropy_coef`` * entropy + ``cfg.kl_loss_coef`` * KL_kind(pi || pi_ref)
    when ``cfg.use_kl_loss``; every term aggregated with ``cfg.loss_agg`` over ``b.actor_mask`` and normalised by
    the mini-batch's ``num_tokens`` / ``num_seqs`` (so micro-batch losses sum to the mini-batch loss). With
    ``b.is_weights`` (rollout correction's ``*_tis`` modes, computed by the driver) each token's policy-gradient
    loss is multiplied by its weight; the entropy and KL terms are not. Tokens its ``*_mask`` modes rejected
    (``b.keep_mask``) are out of ``b.actor_mask``: out of every term and of the normaliser.
    log_probs / entropy: (b, t) at ``cfg.temperature`` for ``b``'s tokens (0 off the mask); ``b`` holds
    ``old_log_probs`` and ``advantages`` (and ``ref_log_probs`` with the KL loss), all (b, t). ``old_log_probs``
    None: the update is exactly on-policy (one epoch, one mini-batch) and ``log_probs``, detached, are the old ones.
    """
    mask = b.actor_mask
    agg = {"agg": cfg.loss_agg, "num_tokens": num_tokens, "num_seqs": num_seqs, "seq_tokens": b.seq_tokens}
    old = log_probs.detach() if b.old_log_probs is None else b.old_log_probs  # None: exactly on-policy, ratio 1
    pg, m = policy_loss(log_probs, old, b.advantages, mask, clip_low=cfg.clip_low,
                        clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, is_weights=b.is_weights, **agg)
    loss = pg
    if cfg.entropy_coef != 0.0:
        loss = loss - cfg.entropy_coef * entropy_loss(entropy, mask, **agg)
    n = float(mask.bool().sum())
    token_sums = {"actor/pg_clipfrac": m["actor/pg_clipfrac"] * n, "actor/ppo_kl": m["actor/ppo_kl"] * n,
                  "actor/entropy": float(torch.where(mask.bool(), entropy.detach(), 0.0).sum())}
    sums = {"actor/pg_loss": float(pg.detach())}
    if cfg.use_kl_loss:
        kl = kl_loss(log_probs, b.ref_log_probs, mask, kind=cfg.kl_kind, **agg)
        loss = loss + cfg.kl_loss_coef * kl
        sums["actor/kl_loss"] = float(kl.detach())
        kl_mat = kl_estimate(log_probs.detach(), b.ref_log_probs, cfg.kl_kind)
        token_sums["actor/kl"] = float(torch.where(mask.bool(), kl_mat, torch.zeros_like(kl_mat)).sum())
    return loss, token_sums, sums


class PolicyWorker:
    """One rank of the policy (``role='actor'``) or reference (``role='ref'``, frozen, no optimizer) group.

    The model is built on the meta device, sharded, and only this rank's shards are allocated and read from the
    checkpoint (``ragen.workers.materialize``): no rank holds a full copy while it starts. The actor keeps fp32
    master weights; the reference holds its weights in its compute precision (``weight_dtype``: bf16 where
    ``mixed_precision`` resolves to bf16 on its device, else fp32), so its log-probs differ from an fp32-weight
    reference by bf16 rounding of the weights (the ``bf16`` compute rounds them anyway).

    Args: ``model_name_or_path`` (alias, folder or hub id, see ``ragen.models.load_model``), ``cfg``,
    ``rank`` / ``world_size`` / ``master_addr`` / ``master_port`` (process group; world size 1 needs none),
    ``tiny`` (kwargs of ``ragen.models.tiny_model``: build a tiny random model instead, for tests),
    ``cache_dir`` (converted-model cache), ``num_threads`` (torch intra-op threads of this rank; Ray sets
    OMP_NUM_THREADS from the actor's CPUs, 1 for fractional CPUs, so co-located groups that take turns on the
    same cores should pass the core count here), ``value_head`` (the actor is also the critic: a value head on its
    backbone, trained jointly; ``compute_values`` as ``CriticWorker``'s), ``attn_implementation``
    (``model.attn_implementation``; ``auto`` is resolved on this rank's device with ``cfg.mixed_precision``:
    ``ragen.models.attention``; the resolved name is ``self.attn_implementation``), ``device`` (the run's
    ``trainer.device``, ``cpu`` / ``cuda``; None: CUDA when visible; ``ragen.workers.dist.init_distributed``),
    ``engine`` (an actor rank hosts this rollout engine, ``ragen.workers.engine_host``: built and put to sleep before
    the model, so it finds the device free; ``engine_generate`` / ``engine_sleep`` / ``engine_wake`` /
    ``sync_engine_weights``).
    """

    def __init__(self, model_name_or_path: str, cfg: ActorConfig, rank: int = 0, world_size: int = 1,
                 master_addr: str = "127.0.0.1", master_port: int = 29500, *, role: str = "actor",
                 tiny: dict | None = None, cache_dir: str | None = None, num_threads: int | None = None,
                 value_head: SharedValueHead | None = None, attn_implementation: str = "auto",
                 device: str | None = None, engine: EngineSpec | None = None):
        if role not in ROLES:
            raise ValueError(f"role={role!r} is unknown; use one of {ROLES}")
        if engine is not None and role != "actor":
            raise ValueError(f"only the actor hosts a rollout engine, not role={role!r}")
        self.cfg, self.rank, self.world_size, self.role = cfg, rank, world_size, role
        self.model_name_or_path, self.tiny, self.cache_dir = model_name_or_path, tiny, cache_dir
        if num_threads:
            torch.set_num_threads(num_threads)
        match_driver_priority()
        redirect_worker_output()
        torch.manual_seed(cfg.seed)
        self.device = D.init_distributed(rank, world_size, master_addr, master_port, device=device)
        self.attn_implementation = resolve_attn_implementation(attn_implementation, self.device, cfg.mixed_precision)[0]
        # the rollout engine first, asleep before the training model exists (ragen.workers.engine_host)
        self.engine_host = None if engine is None else EngineHost(engine, self.device, rank, world_size)
        self.lora = cfg.lora and role == "actor"
        self.value_spec = value_head if role == "actor" else None
        self.module = self._build(model_name_or_path, tiny, cache_dir)
        self.module.eval()
        self.trainable: Trainable | None = None
        if role == "ref":
            self.module.requires_grad_(False)
        else:
            head_lr = {"value_head.": self.value_spec.lr} if self.value_spec else None
            self.trainable = Trainable(self.module, cfg, self.device, world_size, prefix="actor", lr_by_prefix=head_lr)

    def _build(self, model_name_or_path: str, tiny: dict | None, cache_dir: str | None) -> LogProbModel:
        """The (sharded) ``LogProbModel``: built on the meta device with its LoRA adapters and value head, sharded,
        then given its values: the checkpoint's weights, LoRA's seeded initial adapters (those of a plain build,
        ``initial_adapters``), a zero value head."""
        cfg = self.cfg
        lm, reader = M.open_model(model_name_or_path, tiny, cache_dir,
                                  weight_dtype(self.role, cfg.mixed_precision, self.device),
                                  attn_implementation=self.attn_implementation)
        adapters: dict[str, torch.Tensor] = {}
        if self.lora:
            adapters = initial_adapters(lm, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules, seed=cfg.seed)
            self._initial_adapters = adapters  # CPU, small: merge_adapters() starts the adapters again from them
            add_lora(lm, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules, seed=cfg.seed)
        if cfg.gradient_checkpointing and self.role == "actor":
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.config = lm.config
        head = None
        if self.value_spec:
            with torch.device("meta"):
                head = zero_value_head(lm.config.hidden_size)
        detach = bool(self.value_spec and self.value_spec.grad == "head")
        module = D.shard_model(LogProbModel(lm, head, detach_values=detach), lm.model.layers, device=self.device,
                               mixed_precision=cfg.mixed_precision)
        plan = M.reader_sources(reader, lm_names(module, reader))
        plan.update(M.reader_sources(MemoryReader(adapters), {f"lm.{k}": k for k in adapters}))
        if head is not None:
            plan.update(M.zeros(("value_head.weight", (1, lm.config.hidden_size)), ("value_head.bias", (1,))))
        return M.materialize(module, plan)

    # ---------------------------------------------------------------------------------------------- forward
    def _log_probs(self, b: TrainBatch, with_entropy: bool, temperature: float | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        target = b.response_mask if b.loss_mask is None else (b.response_mask.bool() | b.loss_mask.bool()).long()
        temperature = self.cfg.temperature if temperature is None else temperature
        with D.compute_autocast(self.device, self.cfg.mixed_precision):
            return self.module(b.input_ids, b.attention_mask, target_mask=target, temperature=temperature,
                               chunk_size=self.cfg.log_prob_chunk_size, with_entropy=with_entropy,
                               checkpoint=self.cfg.checkpoint_lm_head)

    def _with_values(self, b: TrainBatch, with_entropy: bool) -> tuple[torch.Tensor, ...]:
        """(log_probs, entropy, values, last_values) from one forward (``value_head`` actors)."""
        target = b.response_mask if b.loss_mask is None else (b.response_mask.bool() | b.loss_mask.bool()).long()
        with D.compute_autocast(self.device, self.cfg.mixed_precision):
            return self.module(b.input_ids, b.attention_mask, target_mask=target, temperature=self.cfg.temperature,
                               chunk_size=self.cfg.log_prob_chunk_size, with_entropy=with_entropy,
                               checkpoint=self.cfg.checkpoint_lm_head, with_values=True)

    @worker_phase("values", optimizer=False)
    def compute_values(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(values (B_local, T), last_values (B_local,)) of the shared value head, no grad, in the convention of
        ``CriticWorker.compute_values`` (``values[:, t]`` = V of the context before token t)."""
        if self.value_spec is None:
            raise RuntimeError("compute_values() needs an actor built with value_head (critic.share_backbone=true)")
        size = self.cfg.infer_micro_batch_size or self.cfg.micro_batch_size
        return forward_in_chunks(batch, size, self.device, lambda b: self._with_values(b, False)[2:])

    @worker_phase("log_probs", optimizer=False)
    def compute_log_probs_and_values(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_probs (B_local, T), values (B_local, T), last_values (B_local,)) from one no-grad forward of an actor
        with the shared value head: what ``compute_log_probs`` and ``compute_values`` return, in their conventions,
        for the cost of one pass (the two read the same hidden states)."""
        if self.value_spec is None:
            raise RuntimeError("compute_log_probs_and_values() needs an actor built with value_head "
                               "(critic.share_backbone=true); otherwise call compute_log_probs")
        size = self.cfg.infer_micro_batch_size or self.cfg.micro_batch_size

        def fn(b: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            lp, _, values, last = self._with_values(b, False)
            return lp, values, last

        return forward_in_chunks(batch, size, self.device, fn)

    @worker_phase("log_probs", optimizer=False)
    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs (B_local, T) fp32 of each response token under the current policy (no grad).

        Computed on ``response_mask`` (and ``loss_mask``) tokens only; 0 elsewhere.
        """
        size = self.cfg.infer_micro_batch_size or self.cfg.micro_batch_size
        return forward_in_chunks(batch, size, self.device, lambda b: self._log_probs(b, with_entropy=False)[0])

    @worker_phase("ref_log_probs", optimizer=False)
    def compute_ref_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """Log-probs (B_local, T) of the reference policy of a LoRA actor: the frozen base, adapters off. Same
        positions as ``compute_log_probs``."""
        if not self.lora:
            raise RuntimeError("compute_ref_log_probs() needs a LoRA actor (actor.lora_rank > 0); without LoRA the "
                               "reference is its own worker group (role='ref')")
        with adapters_disabled(self.module):
            return self.compute_log_probs(batch)

    @worker_phase("collapse", optimizer=False)
    def collapse_cross(self, prompts: list[list[int]], responses: list[list[int]], turns: list[int],
                       pad_id: int) -> torch.Tensor:
        """The template-collapse cross matrix (N, N) float32 on CPU (``ragen.workers.collapse_probe``):
        ``[i, j] = log pi(responses[j] | prompts[i])`` summed over response j's tokens, under the current weights at
        ``cfg.temperature`` (the sampling distribution), for pairs of the same turn (``turns[i] == turns[j]``); NaN
        elsewhere. No grad; ``infer_micro_batch_size`` (else ``micro_batch_size``) sequences per forward. Every rank
        of a sharded actor must get the same arguments (the forwards are collectives): ``WorkerGroup.call_rank0``."""
        turn = torch.tensor(turns, dtype=torch.long)
        size = self.cfg.infer_micro_batch_size or self.cfg.micro_batch_size

        def score(ids: torch.Tensor, attn: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            with D.compute_autocast(self.device, self.cfg.mixed_precision):
                lp, _ = self.module(ids, attn, target_mask=target, temperature=self.cfg.temperature,
                                    chunk_size=self.cfg.log_prob_chunk_size, with_entropy=False,
                                    checkpoint=self.cfg.checkpoint_lm_head)
            return lp

        return cross_log_probs(score, prompts, responses, batch_size=size, pad_id=pad_id,
                               pair_mask=turn[:, None] == turn[None, :], device=self.device)

    # ---------------------------------------------------------------------------------------------- update
    def _micro_loss(self, b: TrainBatch, num_tokens: float, num_seqs: float) -> MicroResult:
        cfg, mask = self.cfg, b.actor_mask
        if self.value_spec is None:
            lp, ent = self._log_probs(b, with_entropy=True)
        else:
            lp, ent, values, _ = self._with_values(b, with_entropy=True)
        loss, token_sums, sums = policy_objective(cfg, lp, ent, b, num_tokens, num_seqs)
        if self.value_spec is not None:
            loss = loss + self._value_term(b, values, mask, num_tokens, num_seqs, token_sums, sums)
        sums["actor/loss"] = float(loss.detach())
        return MicroResult(loss=loss, token_sums=token_sums, sums=sums)

    def _value_term(self, b: TrainBatch, values: torch.Tensor, mask: torch.Tensor, num_tokens: float,
                    num_seqs: float, token_sums: dict, sums: dict) -> torch.Tensor:
        """``coef`` * the critic's clipped value loss for the shared head over ``mask`` (the actor's loss mask: model
        tokens, whose counts normalise the mini-batch); adds critic/* metrics."""
        spec = self.value_spec
        vl, m = value_loss(values, b.values, b.returns, mask, clip=spec.clip, agg=self.cfg.loss_agg,
                           num_tokens=num_tokens, num_seqs=num_seqs, seq_tokens=b.seq_tokens)
        n = float(mask.bool().sum())
        token_sums["critic/vf_clipfrac"] = m["critic/vf_clipfrac"] * n
        token_sums["critic/values_mean"] = float(torch.where(mask.bool(), values.detach(), 0.0).sum())
        sums["critic/vf_loss"] = float(vl.detach())
        return spec.coef * vl

    @worker_phase("update")
    def update(self, batch: TrainBatch, progress: tuple[int, int] | None = None) -> dict[str, float]:
        """PPO update on this rank's shard (all ranks call together); returns all-reduced metrics. ``progress``:
        (this update's index, the run's updates) for the lr schedule (``Trainable.update``).

        Needs ``old_log_probs`` and ``advantages`` (and ``ref_log_probs`` when ``use_kl_loss``); ``old_log_probs``
        may be None only where the update is exactly on-policy (``ppo_epochs`` 1 and every row in one mini-batch):
        the update's own detached log-probs are then the old ones (``policy_objective``). Metrics:
        actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl, actor/entropy, actor/loss, actor/grad_norm, actor/lr,
        actor/skipped_steps (+ actor/kl_loss, actor/kl with the KL loss), averaged over optimizer steps.
        """
        if self.trainable is None:
            raise RuntimeError("update() called on a role='ref' PolicyWorker; the reference policy is frozen")
        on_policy = self.cfg.ppo_epochs == 1 and self.trainable.local_mini_batch_size(batch.batch_size) \
            >= batch.batch_size  # one epoch over one mini-batch: the first forward's log-probs are the old ones
        needed = (("advantages",) + (() if on_policy else ("old_log_probs",))
                  + (("values", "returns") if self.value_spec else ()))
        missing = [n for n in needed if getattr(batch, n) is None]
        if self.cfg.use_kl_loss and batch.ref_log_probs is None:
            missing.append("ref_log_probs (actor.use_kl_loss=true)")
        if missing:
            raise ValueError(f"PolicyWorker.update needs batch fields {missing}; compute them before the update")
        return self.trainable.update(batch, lambda b: b.actor_mask, self._micro_loss, progress=progress)

    def _sft_micro_loss(self, b: TrainBatch, num_tokens: float, num_seqs: float) -> MicroResult:
        lp, _ = self._log_probs(b, with_entropy=False, temperature=1.0)
        mask = b.policy_mask
        loss = bc_loss(lp, mask, agg=self.cfg.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs,
                       seq_tokens=b.seq_tokens)
        m = mask.bool()
        token_sums = {"sft/nll": float(torch.where(m, -lp.detach(), 0.0).sum())}
        return MicroResult(loss=loss, token_sums=token_sums, sums={"sft/loss": float(loss.detach())})

    @worker_phase()
    def sft_update(self, batch: TrainBatch, epochs: int = 1, lr: float | None = None,
                   lr_end: float | None = None) -> dict[str, float]:
        """Supervised update (behaviour cloning, ``bc_loss``) on demonstrated tokens: the ``response_mask`` (or
        ``loss_mask``) tokens of ``batch``, at temperature 1, with the actor's optimizer, schedule, mini/micro
        batches and loss aggregation; ``lr`` fixes the learning rate (the RL schedule is neither read nor advanced),
        ``lr_end`` decays it linearly over this call's optimizer steps (``Trainable.update``).
        Metrics: sft/loss (the aggregated loss), sft/nll (mean NLL per token), actor/grad_norm, actor/lr,
        actor/skipped_steps."""
        if self.trainable is None:
            raise RuntimeError("sft_update() called on a role='ref' PolicyWorker; the reference policy is frozen")
        return self.trainable.update(batch, lambda b: b.policy_mask, self._sft_micro_loss, epochs=epochs, lr=lr,
                                     lr_end=lr_end)

    @worker_phase()
    def reset_optimizer(self) -> None:
        """Forget the actor's optimizer moments (after a warm start: RL starts with fresh Adam statistics)."""
        if self.trainable is not None:
            self.trainable.reset_optimizer()

    # ---------------------------------------------------------------------------------------------- weights
    @worker_phase(optimizer=False)
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full unsharded fp32 weights with transformers key names (``model.layers.0...``) on rank 0, ``{}`` on
        other ranks (all ranks must call). For syncing rollout engines."""
        return self._policy_weights(D.full_state_dict(self.module))

    def _policy_weights(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The causal LM's weights (transformers names) from this module's full state dict: LoRA merged, value
        head left out."""
        return dict(self._policy_items(raw.items()))

    def _policy_items(self, items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """``_policy_weights`` over (name, tensor) pairs in state-dict order, lazily (the weight sync's stream)."""
        lm = ((k[len("lm."):], v) for k, v in items if k.startswith("lm."))
        return merge_lora_stream(lm, self.cfg.lora_alpha / self.cfg.lora_rank) if self.lora else lm

    # hosted rollout engine (ragen.workers.engine_host; the driver's handle: ragen.trainer.hosted)
    def _engine(self) -> EngineHost:
        if self.engine_host is None:
            raise RuntimeError("this PolicyWorker hosts no rollout engine (build it with engine=EngineSpec(...))")
        return self.engine_host

    def engine_generate(self, prompts: list[list[int]], sampling: Any) -> list[Any]:
        """Samples of this rank's engine for ``prompts`` (its share of a turn), in order."""
        return self._engine().generate(prompts, sampling)

    def engine_sleep(self) -> None:
        self._engine().sleep()

    def engine_wake(self, tags: tuple[str, ...] | None = None) -> None:
        self._engine().wake(tags)

    def engine_asleep(self) -> tuple[str, ...]:
        """The parts of this rank's engine asleep now (the engine's own record), in ``ENGINE_PARTS`` order."""
        from ragen.rollout.base import ENGINE_PARTS

        asleep = self._engine().asleep
        return tuple(p for p in ENGINE_PARTS if p in asleep)

    @worker_phase(optimizer=False)
    def sync_engine_weights(self) -> dict[str, float]:
        """This actor's weights into its rank's engine (all ranks call: each parameter's gather is a collective),
        one tensor at a time at the engine's dtype, LoRA merged, value head left out; returns the summary
        (tensors, bytes, seconds), never weights."""
        host = self._engine()
        state = {k: v for k, v in self.module.state_dict(keep_vars=True).items() if k.startswith("lm.")}
        with torch.no_grad():
            return host.load_weights(self._policy_items(gathered(state))).as_metrics()

    # NCCL sync to a separately placed vLLM engine (ragen.workers.weight_broadcast; GPU only)
    def sync_address(self) -> tuple[str, int]:
        """(node IP, free port) where rank 0 hosts the sync group's rendezvous."""
        from ragen.workers.weight_broadcast import free_address

        return free_address()

    def init_weight_sender(self, host: str, port: int, world_size: int) -> None:
        """Rank 0 joins the sync group as its rank 0 (all ranks may call; others do nothing)."""
        if self.rank == 0:
            from ragen.rollout.vllm_nccl import NcclWeightSender
            from ragen.workers.weight_broadcast import WeightBroadcaster

            self._broadcaster = WeightBroadcaster(NcclWeightSender(host, port, world_size, self.device))

    def plan_weight_buckets(self, dtype: str, bucket_bytes: int) -> Any:
        """Gather the full weights (all ranks call) and plan their buckets on rank 0 (None elsewhere)."""
        state = self.full_state_dict()
        return self._broadcaster.make_plan(state, dtype, bucket_bytes) if self.rank == 0 else None

    def broadcast_bucket(self, index: int) -> int:
        """Rank 0: broadcast planned bucket ``index`` to the engine's workers."""
        return self._broadcaster.send(index)

    @worker_phase(optimizer=False)
    def merge_adapters(self) -> None:
        """LoRA: fold the adapters into the frozen base (base += scale * B @ A, on this rank's rows) and start them
        again from their initial values (A as built from the seed, B = 0), so the policy is unchanged, the reference
        (the base, adapters off) becomes this policy, and training goes on exactly as from a checkpoint of the
        merged weights (``ragen sft``, then ``model.path=<actor folder>``). After a warm start, before RL; the
        optimizer state is reset separately (``reset_optimizer``)."""
        if not self.lora:
            raise RuntimeError("merge_adapters() needs a LoRA actor (actor.lora_rank > 0)")
        from torch.distributed.tensor import DTensor, distribute_tensor

        D.reshard(self.module)
        params = dict(self.module.named_parameters())
        scale = self.cfg.lora_alpha / self.cfg.lora_rank
        with torch.no_grad():
            for name in self._initial_adapters:  # every merge first: it reads the trained B
                if ".lora_A." in name:
                    a = params[f"lm.{name}"]
                    base_name, b_name = adapter_names_of_a(name)
                    a_full = a.full_tensor() if isinstance(a, DTensor) else a
                    w, b_rows = _local(params[f"lm.{base_name}"]), _local(params[f"lm.{b_name}"])  # the same rows
                    w.copy_(merge_weight(w, a_full, b_rows, scale))
            for name, initial in self._initial_adapters.items():
                param = params[f"lm.{name}"]
                value = initial.to(param.device, param.dtype)
                if isinstance(param, DTensor):
                    value = distribute_tensor(value, param.device_mesh, param.placements)
                param.copy_(value)

    @worker_phase()
    def save(self, dir: str, optimizer: bool = True) -> None:
        """Write a checkpoint folder (all ranks call): the policy as a transformers model (config, safetensors,
        generation config, tokenizer files when available; ``from_pretrained(dir)`` loads it; a LoRA actor
        writes its merged weights there and its adapters to ``lora/adapter.safetensors``; a shared value head goes
        to ``value_head.safetensors``) and, for the actor, ``optimizer.pt`` (full optimizer + lr scheduler state,
        world-size independent) unless ``optimizer`` is false (the weights alone: a reference's copy)."""
        directory = Path(dir)
        raw = D.full_state_dict(self.module)
        if self.rank == 0:
            from safetensors.torch import save_file

            directory.mkdir(parents=True, exist_ok=True)
            self.module.lm.save_pretrained(directory, state_dict=self._policy_weights(raw))
            if self.lora:
                (directory / ADAPTER_FILE).parent.mkdir(exist_ok=True)
                save_file({k: v.contiguous() for k, v in adapter_state(raw).items()}, directory / ADAPTER_FILE)
            if self.value_spec is not None:
                head = {k[len("value_head."):]: v.contiguous() for k, v in raw.items() if k.startswith("value_head.")}
                save_file(head, directory / HEAD_FILE)
            self._save_tokenizer(directory)
        D.barrier()
        if self.trainable is not None and optimizer:
            self.trainable.save_state(directory, self.rank)
        D.barrier()

    def _save_tokenizer(self, directory: Path) -> None:
        from ragen.models import DEFAULT_MODEL, load_tokenizer

        source = DEFAULT_MODEL if self.tiny is not None else self.model_name_or_path
        try:
            load_tokenizer(source, cache_dir=self.cache_dir).save_pretrained(directory)
        except (OSError, ValueError) as exc:  # a weights-only folder: the model is still loadable
            print(f"[PolicyWorker] no tokenizer saved with the checkpoint ({exc})")

    @worker_phase()
    def load(self, dir: str) -> None:
        """Load weights (and, for the actor, optimizer/scheduler state when present) saved by ``save``; every rank
        reads only its own slices of the files (``ragen.workers.materialize``).

        A LoRA actor loads a LoRA checkpoint as base = merged - scale * B @ A plus the adapters (fp32 round-off
        ~1e-7 relative), and a plain checkpoint as its frozen base with the adapters left as they are; a shared
        value head is loaded when the folder has one (else it stays as it is)."""
        directory = Path(dir)
        reader = SafetensorsReader(directory)
        names = lm_names(self.module, reader)
        extra = M.unused(names, reader)
        if extra:
            raise ValueError(f"{directory} holds weights this policy does not have: {extra[:5]}")
        plan = M.reader_sources(reader, names)
        if self.lora and (directory / ADAPTER_FILE).is_file():
            plan.update(self._unmerged_sources(plan, SafetensorsReader(directory / ADAPTER_FILE)))
        if self.value_spec is not None and (directory / HEAD_FILE).is_file():
            head = SafetensorsReader(directory / HEAD_FILE)
            plan.update(M.reader_sources(head, {f"value_head.{k}": k for k in head.keys()}))
        M.load_weights(self.module, plan, optional=lambda n: is_adapter_key(n) or n.startswith("value_head."))
        if self.trainable is not None and (directory / "optimizer.pt").is_file():
            self.trainable.load_state(directory)
        D.barrier()

    def _unmerged_sources(self, merged: dict[str, M.Source], adapters: TensorReader) -> dict[str, M.Source]:
        """Sources of a LoRA checkpoint: the adapters as saved, and each adapted base weight as the merged weight
        minus scale * B @ A, computed on the rows this rank reads."""
        scale = self.cfg.lora_alpha / self.cfg.lora_rank
        plan = M.reader_sources(adapters, {k: k for k in adapters.keys()})
        for name, source in merged.items():
            pair = adapter_names(name)
            if pair is None or pair[0] not in plan:
                continue
            a, b = plan[pair[0]], plan[pair[1]]

            def read(index, w=source, a=a, b=b):
                return merge_weight(w.read(index), a.read((slice(None), *index[1:])), b.read(index[:1]), -scale)

            plan[name] = M.Source(source.shape, read)
        return plan

    def ping(self) -> int:
        """Returns the rank (readiness check for worker groups)."""
        return self.rank

    def location(self) -> dict[str, object]:
        """This rank and where it runs (Ray node id, host, pid): ``ragen.utils.process.location``."""
        return {"rank": self.rank, **location()}

    def memory_stats(self) -> dict[str, float]:
        """This rank's process memory (``rss_gb`` now, ``peak_gb`` so far) and its niceness (``nice``)."""
        return {**memory_stats(), "nice": float(niceness())}

    # ---------------------------------------------------------------------------------------------- GPU memory
    _frozen_offload: StateOffload | None = None  # the reference's (parameters only), made on first use

    def state_offload(self) -> StateOffload:
        """The mover of this rank's state between the device and host memory (``ragen.workers.offload``): the
        actor's parameters, gradients and optimizer state, the reference's parameters."""
        if self.trainable is not None:
            return self.trainable.offloader
        if self._frozen_offload is None:
            self._frozen_offload = StateOffload(self.module, None, self.device)
        return self._frozen_offload

    def offload(self, params: bool = True, optimizer: bool = True) -> None:
        """Move this rank's parameters (with gradients) and / or optimizer state to host memory while the rollout
        engine uses the GPU; the methods that need them bring them back (:meth:`reload`, or for one call)."""
        self.state_offload().offload(params=params, optimizer=optimizer)

    def reload(self) -> None:
        """Bring back what :meth:`offload` moved, bitwise as it was."""
        self.state_offload().reload()

    def phase_memory(self) -> PhasePeaks:
        """The memory peaks of this process's phases since the last call (``ragen.utils.memory.PhaseMemory``)."""
        return PhasePeaks(PHASE_MEMORY.take())
