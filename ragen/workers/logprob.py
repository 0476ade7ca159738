"""Per-token log-probs and entropy of a causal LM without materialising a (B, T, V) fp32 tensor.

The naive recipe ``log_softmax(model(ids).logits.float())`` keeps B*T*V floats (8 x 512 x 49k = 0.8 GB)
plus their gradient. Here the base model produces hidden states once, then the lm_head is applied to
chunks of ``chunk_size`` *selected* tokens (only positions whose log-prob is wanted, so prompt and
padding tokens cost nothing): per chunk we keep only the target logit minus the logsumexp, and the
entropy. With ``checkpoint=True`` each chunk's logits are recomputed in backward instead of stored, so
peak memory is one chunk of logits.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from ragen.models.forward import causal_lm_parts, hidden_states
from ragen.models.value_head import values_from_hidden


def _chunk_stats(head: nn.Module, h: torch.Tensor, targets: torch.Tensor, inv_temp: float,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and entropy for one chunk of hidden states h: (N, H), targets: (N,)."""
    logits = head(h).float()
    if inv_temp != 1.0:
        logits = logits * inv_temp
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lp, torch.zeros_like(lp)
    ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return lp, ent


def log_probs_from_hidden(head: nn.Module, hidden: torch.Tensor, input_ids: torch.Tensor,
                          target_mask: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024,
                          with_entropy: bool = False, checkpoint: bool = True
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs from hidden states; see ``token_log_probs``. hidden: (B, T, H); masks (B, T)."""
    B, T = input_ids.shape
    sel = target_mask.bool().clone()
    sel[:, 0] = False  # nothing predicts the first token
    idx = sel.nonzero(as_tuple=True)  # positions t whose token is predicted from hidden state t - 1
    h = hidden[idx[0], idx[1] - 1]  # (N, H)
    targets = input_ids[idx]
    inv_temp = 1.0 / float(temperature)
    use_ckpt = checkpoint and torch.is_grad_enabled() and h.requires_grad
    lps, ents = [], []
    # at least one (possibly empty) chunk, so the graph reaches every parameter even with nothing selected:
    # under FSDP2 every rank must run the same backward (its reduce-scatters) whatever its mask holds
    for s in range(0, max(h.shape[0], 1), chunk_size):
        args = (head, h[s:s + chunk_size], targets[s:s + chunk_size], inv_temp, with_entropy)
        lp, ent = _checkpoint(_chunk_stats, *args, use_reentrant=False) if use_ckpt else _chunk_stats(*args)
        lps.append(lp)
        ents.append(ent)
    flat_lp = torch.cat(lps)
    log_probs = hidden.new_zeros(B, T, dtype=torch.float32).index_put(idx, flat_lp)
    entropy = None
    if with_entropy:
        flat_ent = torch.cat(ents)
        entropy = hidden.new_zeros(B, T, dtype=torch.float32).index_put(idx, flat_ent)
    return log_probs, entropy


def token_log_probs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                    temperature: float = 1.0, chunk_size: int = 1024, with_entropy: bool = False,
                    target_mask: torch.Tensor | None = None, checkpoint: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(input_ids[:, t] | input_ids[:, :t]) for every position, under autograd.

    input_ids, attention_mask: (B, T), right- or left-padded. Returns ``(log_probs, entropy)``, both (B, T)
    fp32: ``log_probs[:, t]`` is the log-prob of token t under softmax(logits_{t-1} / temperature) (the
    sampling distribution); ``entropy[:, t]`` is that distribution's entropy (``None`` unless
    ``with_entropy``). Position 0, padding and positions outside ``target_mask`` (default: attention_mask;
    pass the response mask to skip prompt / env tokens entirely) are 0.
    The lm_head runs on ``chunk_size`` selected tokens at a time; ``checkpoint`` recomputes each chunk's
    logits in backward so peak memory is one chunk of logits, not B*T*V.
    """
    base, head = causal_lm_parts(model)
    hidden = hidden_states(base, input_ids, attention_mask)
    return log_probs_from_hidden(head, hidden, input_ids, _predicted(attention_mask, target_mask),
                                 temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
                                 checkpoint=checkpoint)


def _predicted(attention_mask: torch.Tensor, target_mask: torch.Tensor | None) -> torch.Tensor:
    """Positions whose log-prob is computed: ``target_mask`` (default all real tokens) where the predicting
    position t - 1 is a real token too. (B, T) bool."""
    mask = attention_mask.bool() if target_mask is None else target_mask.bool() & attention_mask.bool()
    mask[:, 1:] &= attention_mask[:, :-1].bool()
    return mask


class LogProbModel(nn.Module):
    """Wraps a causal LM so one ``forward`` returns token log-probs (and entropy).

    FSDP2 unshards a module's own parameters around its ``forward``; the embeddings, final norm and
    (possibly tied) lm_head live on the root, so the root's forward must be the whole computation. The
    workers shard each decoder layer, then this wrapper. ``lm`` is the wrapped ``*ForCausalLM``.
    """

    def __init__(self, lm: nn.Module, value_head: nn.Module | None = None, detach_values: bool = False):
        super().__init__()
        self.lm = lm
        self.value_head = value_head
        self.detach_values = detach_values  # the value head reads detached hidden states (no value grad to the lm)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor | None = None,
                temperature: float = 1.0, chunk_size: int = 1024, with_entropy: bool = False,
                checkpoint: bool = True, with_values: bool = False) -> tuple[torch.Tensor, ...]:
        """``(log_probs, entropy)`` as ``token_log_probs``; with ``with_values`` (needs ``value_head``: the critic
        sharing this backbone) also ``(values, last_values)`` from the same hidden states, in ``ValueModel``'s
        convention (``ragen.models.value_head.values_from_hidden``)."""
        if not with_values:
            return token_log_probs(self.lm, input_ids, attention_mask, temperature=temperature, chunk_size=chunk_size,
                                   with_entropy=with_entropy, target_mask=target_mask, checkpoint=checkpoint)
        base, head = causal_lm_parts(self.lm)
        hidden = hidden_states(base, input_ids, attention_mask)
        lp, ent = log_probs_from_hidden(head, hidden, input_ids, _predicted(attention_mask, target_mask),
                                        temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
                                        checkpoint=checkpoint)
        values, last_values = values_from_hidden(self.value_head, hidden.detach() if self.detach_values else hidden,
                                                 attention_mask)
        return lp, ent, values, last_values
