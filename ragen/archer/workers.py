"""The ArCHer policy worker: the project's ``PolicyWorker`` plus the token-level REINFORCE update of the paper.

Everything else (FSDP2 sharding, log-probs, behaviour cloning ``sft_update`` reused by online filtered BC,
weights, checkpoints) is the PPO policy worker's; only the loss differs (``ragen.algorithms.archer``).
"""

from __future__ import annotations

from ragen.algorithms.archer import reinforce_loss
from ragen.workers.actor import PolicyWorker
from ragen.workers.data import TrainBatch
from ragen.workers.trainable import MicroResult


class ArcherPolicyWorker(PolicyWorker):
    """``PolicyWorker`` with ``reinforce_update`` (ArCHer's token-level policy gradient)."""

    def reinforce_update(self, batch: TrainBatch, clip: float | None = None, epochs: int = 1) -> dict[str, float]:
        """One pass of -A * sum_t log pi(a_t) over ``batch`` (``advantages`` (B, T): each row's utterance advantage
        on its response tokens; ``old_log_probs`` needed only with ``clip``), mini/micro-batched like PPO.
        Metrics: actor/pg_loss, actor/advantage, actor/log_prob (mean per token), actor/grad_norm, actor/lr."""
        if self.trainable is None:
            raise RuntimeError("reinforce_update() called on a role='ref' PolicyWorker")
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
            return MicroResult(loss=loss, token_sums=token_sums, sums={"actor/pg_loss": float(loss.detach())})

        return self.trainable.update(batch, lambda b: b.policy_mask, micro, epochs=epochs)
