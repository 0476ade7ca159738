"""The ArCHer policy worker: the project's ``PolicyWorker`` plus the token-level REINFORCE update of the paper and
online filtered BC's behaviour-cloning update.

Everything else (FSDP2 sharding, log-probs, weights, checkpoints) is the PPO policy worker's; only the losses differ
(``ragen.algorithms.archer``). Both updates take ``loss_scale`` (``ArcherSection.loss_scale``): a factor on each
mini-batch's loss before backward, so ``archer.summed_micro_batches=N`` reproduces the reference code's sum of N
micro-batch means ahead of the grad-norm clip; the reported losses are unscaled.
"""

from __future__ import annotations

import torch

from ragen.algorithms.archer import filtered_bc_loss, reinforce_loss
from ragen.workers.actor import PolicyWorker
from ragen.workers.data import TrainBatch
from ragen.workers.trainable import MicroResult


class ArcherPolicyWorker(PolicyWorker):
    """``PolicyWorker`` with ``reinforce_update`` (ArCHer's token-level policy gradient) and ``bc_update``
    (online filtered BC)."""

    def _trainable(self, name: str):
        if self.trainable is None:
            raise RuntimeError(f"{name}() called on a role='ref' PolicyWorker")
        return self.trainable

    def reinforce_update(self, batch: TrainBatch, clip: float | None = None, epochs: int = 1,
                         loss_scale: float = 1.0) -> dict[str, float]:
        """One pass of -A * sum_t log pi(a_t) over ``batch`` (``advantages`` (B, T): each row's utterance advantage
        on its response tokens; ``old_log_probs`` needed only with ``clip``), mini/micro-batched like PPO, each
        mini-batch's loss times ``loss_scale``.
        Metrics: actor/pg_loss, actor/advantage, actor/log_prob (mean per token), actor/grad_norm, actor/lr."""
        trainable = self._trainable("reinforce_update")
        if batch.advantages is None or (clip is not None and batch.old_log_probs is None):
            raise ValueError("reinforce_update needs batch.advantages (and old_log_probs when clip is set)")

        def micro(b: TrainBatch, num_tokens: float, num_seqs: float) -> MicroResult:
            lp, _ = self._log_probs(b, with_entropy=False)
            mask = b.policy_mask
            m = mask.bool()
            row_adv = (b.advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
            loss = reinforce_loss(lp, row_adv, mask, num_seqs=num_seqs, old_log_probs=b.old_log_probs, clip=clip)
            token_sums = {"actor/log_prob": float(lp.detach()[m].sum()),
                          "actor/advantage": float(b.advantages[m].sum())}
            return MicroResult(loss=loss * loss_scale, token_sums=token_sums,
                               sums={"actor/pg_loss": float(loss.detach())})

        return trainable.update(batch, lambda b: b.policy_mask, micro, epochs=epochs)

    def bc_update(self, batch: TrainBatch, agg: str = "token-mean", loss_scale: float = 1.0) -> dict[str, float]:
        """One pass of behaviour cloning (``filtered_bc_loss`` with ``agg``: ``token-mean`` | ``utterance-sum``) on
        the ``response_mask`` tokens of ``batch``, at temperature 1, with the actor's optimizer, schedule and
        mini/micro batches, each mini-batch's loss times ``loss_scale``.
        Metrics: sft/loss (the aggregated, unscaled loss per mini-batch), sft/nll (mean NLL per token),
        actor/grad_norm, actor/lr, actor/skipped_steps."""
        trainable = self._trainable("bc_update")

        def micro(b: TrainBatch, num_tokens: float, num_seqs: float) -> MicroResult:
            lp, _ = self._log_probs(b, with_entropy=False, temperature=1.0)
            mask = b.policy_mask
            loss = filtered_bc_loss(lp, mask, agg=agg, num_tokens=num_tokens, num_seqs=num_seqs)
            token_sums = {"sft/nll": float(torch.where(mask.bool(), -lp.detach(), 0.0).sum())}
            return MicroResult(loss=loss * loss_scale, token_sums=token_sums, sums={"sft/loss": float(loss.detach())})

        return trainable.update(batch, lambda b: b.policy_mask, micro, epochs=1)
