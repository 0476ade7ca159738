"""Critic worker: a ``ValueModel`` (causal-LM backbone + value head) per rank, FSDP2-sharded like the policy.

Values are produced at every real position; the clipped value loss (``ragen.algorithms.losses.value_loss``)
covers model tokens only by default (``mask_env_tokens``: the estimators never read values at prompt or
env tokens, so fitting them only spends capacity) or every real token otherwise.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ragen.algorithms.losses import value_loss
from ragen.models.attention import resolve_attn_implementation
from ragen.models.meta import empty_model
from ragen.models.value_head import HEAD_FILE, ValueModel
from ragen.models.weights import SafetensorsReader, TensorReader
from ragen.utils.console import redirect_worker_output
from ragen.utils.memory import PHASE_MEMORY, PhasePeaks, memory_stats
from ragen.utils.process import location, match_driver_priority, niceness
from ragen.workers import dist as D
from ragen.workers import materialize as M
from ragen.workers.config import CriticConfig
from ragen.workers.data import TrainBatch
from ragen.workers.offload import StateOffload, worker_phase
from ragen.workers.trainable import MicroResult, Trainable, forward_in_chunks


class CriticWorker:
    """One rank of the critic group. Same constructor arguments as ``PolicyWorker`` (no role, no value head).

    ``model_name_or_path`` is either a causal LM (alias, folder, hub id: the backbone is initialised from it and
    the head from zero) or a folder written by ``save`` (backbone + ``value_head.safetensors``). Like the policy,
    the model is built on the meta device and each rank reads only its own shards (``ragen.workers.materialize``);
    weights are fp32 (master weights).
    """

    def __init__(self, model_name_or_path: str, cfg: CriticConfig, rank: int = 0, world_size: int = 1,
                 master_addr: str = "127.0.0.1", master_port: int = 29500, *, tiny: dict | None = None,
                 cache_dir: str | None = None, num_threads: int | None = None, attn_implementation: str = "auto",
                 device: str | None = None):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        if num_threads:
            torch.set_num_threads(num_threads)
        match_driver_priority()
        redirect_worker_output()
        torch.manual_seed(cfg.seed)
        self.device = D.init_distributed(rank, world_size, master_addr, master_port, device=device)
        self.attn_implementation = resolve_attn_implementation(attn_implementation, self.device, cfg.mixed_precision)[0]
        if tiny is None and (Path(model_name_or_path) / HEAD_FILE).is_file():
            backbone, path = empty_model(model_name_or_path, base=True, attn_implementation=self.attn_implementation)
            with torch.device("meta"):
                model = ValueModel(backbone)
            reader, head = SafetensorsReader(path), SafetensorsReader(Path(path) / HEAD_FILE)
        else:
            lm, reader = M.open_model(model_name_or_path, tiny, cache_dir,
                                      attn_implementation=self.attn_implementation)
            with torch.device("meta"):
                model = ValueModel.from_causal_lm(lm)
            head = None
        if cfg.gradient_checkpointing:
            model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.module = D.shard_model(model, model.layers, device=self.device, mixed_precision=cfg.mixed_precision)
        plan = M.reader_sources(reader, self._backbone_names(reader))
        if head is None:
            plan.update(M.zeros(("head.weight", (1, model.backbone.config.hidden_size)), ("head.bias", (1,))))
        else:
            plan.update(M.reader_sources(head, {f"head.{k}": k for k in head.keys()}))
        M.materialize(self.module, plan)
        self.module.eval()
        self.trainable = Trainable(self.module, cfg, self.device, world_size, prefix="critic")

    def _backbone_names(self, reader: TensorReader) -> dict[str, str]:
        """{module name: name in ``reader``} of the backbone's weights (a critic folder's names, or a causal LM's
        with the base model's prefix)."""
        names = [n for group, _ in M.module_tensors(self.module) for n in group]
        prefix = f"{self.module.backbone.base_model_prefix}."
        return M.checkpoint_names(names, reader.keys(), prefix="backbone.", base_prefix=prefix)

    def loss_mask(self, batch: TrainBatch) -> torch.Tensor:
        """Tokens the value loss covers: the policy mask (model tokens) or, without mask_env_tokens, all real
        tokens. (B, T)."""
        return batch.policy_mask if self.cfg.mask_env_tokens else batch.attention_mask

    def _values(self, b: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with D.compute_autocast(self.device, self.cfg.mixed_precision):
            return self.module(b.input_ids, b.attention_mask)

    @worker_phase("values", optimizer=False)
    def compute_values(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(values (B_local, T), last_values (B_local,)) fp32, no grad, in the convention of ``ValueModel``:
        ``values[:, t]`` is V of the context before token t; ``last_values`` is V after the last real token (on a
        batch of bootstrap prompts, V of each prompt: ``ragen.ppo.truncation``)."""
        size = self.cfg.infer_micro_batch_size or self.cfg.micro_batch_size
        return forward_in_chunks(batch, size, self.device, self._values)

    def _micro_loss(self, b: TrainBatch, num_tokens: float, num_seqs: float) -> MicroResult:
        mask = self.loss_mask(b)
        values, _ = self._values(b)
        loss, m = value_loss(values, b.values, b.returns, mask, clip=self.cfg.value_clip, agg=self.cfg.loss_agg,
                             num_tokens=num_tokens, num_seqs=num_seqs, seq_tokens=b.seq_tokens)
        n = float(mask.bool().sum())
        vals = torch.where(mask.bool(), values.detach(), 0.0)
        return MicroResult(loss=loss, token_sums={"critic/vf_clipfrac": m["critic/vf_clipfrac"] * n,
                                                  "critic/values_mean": float(vals.sum())},
                           sums={"critic/vf_loss": float(loss.detach())})

    @worker_phase("update")
    def update(self, batch: TrainBatch, progress: tuple[int, int] | None = None) -> dict[str, float]:
        """Value update on this rank's shard (all ranks call); needs ``values`` (old) and ``returns``. ``progress``:
        (this update's index, the run's updates) for the lr schedule (``Trainable.update``).

        Metrics (all-reduced): critic/vf_loss, critic/vf_clipfrac, critic/values_mean, critic/grad_norm,
        critic/lr, critic/skipped_steps.
        """
        missing = [n for n in ("values", "returns") if getattr(batch, n) is None]
        if missing:
            raise ValueError(f"CriticWorker.update needs batch fields {missing}; compute values and advantages first")
        return self.trainable.update(batch, self.loss_mask, self._micro_loss, progress=progress)

    @worker_phase()
    def save(self, dir: str) -> None:
        """Write backbone (transformers folder) + ``value_head.safetensors`` + ``optimizer.pt`` (all ranks call)."""
        directory = Path(dir)
        state = D.full_state_dict(self.module)
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            self.module.save(directory, state=state)
        D.barrier()
        self.trainable.save_state(directory, self.rank)
        D.barrier()

    @worker_phase()
    def load(self, dir: str) -> None:
        """Load weights and optimizer/scheduler state written by ``save`` (each rank reads its own slices)."""
        directory = Path(dir)
        reader, head = SafetensorsReader(directory), SafetensorsReader(directory / HEAD_FILE)
        names = self._backbone_names(reader)
        extra = M.unused(names, reader)
        if extra:
            raise ValueError(f"{directory} holds weights this critic does not have: {extra[:5]}")
        plan = M.reader_sources(reader, names)
        plan.update(M.reader_sources(head, {f"head.{k}": k for k in head.keys()}))
        M.load_weights(self.module, plan)
        if (directory / "optimizer.pt").is_file():
            self.trainable.load_state(directory)
        D.barrier()

    def ping(self) -> int:
        return self.rank

    def location(self) -> dict[str, object]:
        """This rank and where it runs (Ray node id, host, pid): ``ragen.utils.process.location``."""
        return {"rank": self.rank, **location()}

    def memory_stats(self) -> dict[str, float]:
        """This rank's process memory (``rss_gb`` now, ``peak_gb`` so far) and its niceness (``nice``)."""
        return {**memory_stats(), "nice": float(niceness())}

    # ---------------------------------------------------------------------------------------------- GPU memory
    role = "critic"  # names its phases' memory peaks (critic_values, critic_update)

    def state_offload(self) -> StateOffload:
        """The mover of this rank's parameters, gradients and optimizer state (``ragen.workers.offload``)."""
        return self.trainable.offloader

    def offload(self, params: bool = True, optimizer: bool = True) -> None:
        """Move this rank's parameters (with gradients) and / or optimizer state to host memory while the rollout
        engine uses the GPU; the methods that need them bring them back (:meth:`reload`, or for one call)."""
        self.trainable.offload(params=params, optimizer=optimizer)

    def reload(self) -> None:
        """Bring back what :meth:`offload` moved, bitwise as it was."""
        self.trainable.reload()

    def phase_memory(self) -> PhasePeaks:
        """The memory peaks of this process's phases since the last call (``ragen.utils.memory.PhaseMemory``)."""
        return PhasePeaks(PHASE_MEMORY.take())
