"""Per-token log-probs and entropy of a causal LM without materialising a (B, T, V) fp32 tensor.

The naive recipe ``log_softmax(model(ids).logits.float())`` keeps B*T*V floats (8 x 512 x 49k = 0.8 GB)
plus their gradient. Here the base model produces hidden states once, then the lm_head is applied to
chunks of ``chunk_size`` *selected* tokens (only positions whose log-prob is wanted, so prompt and
padding tokens cost nothing): per chunk we keep only the target logit minus the logsumexp, and the
entropy.

A plain ``nn.Linear`` head runs each chunk as one autograd function (``_HeadChunk``) whose backward forms the
logits' gradient in closed form (softmax minus one-hot, and the entropy's ``-p (log p + H)``) and applies it to
the hidden states and the head's weight directly, instead of differentiating through logsumexp, gather and
softmax. Any other head (a LoRA-wrapped one, a module with hooks, a sharded weight) runs the generic path:
autograd through ``head(h)``. Both compute the same forward values op for op.

``checkpoint`` is a memory knob with identical numbers: ``True`` recomputes each chunk's logits in backward
(peak memory one chunk of fp32 logits), ``False`` keeps every chunk's logits of the micro-batch for backward
(one lm_head matmul per chunk less).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from ragen.models.forward import causal_lm_parts, hidden_states
from ragen.models.value_head import values_from_hidden


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Logits in at least fp32 (bf16/fp16 compute upcast; fp32 and fp64 kept)."""
    return logits.float() if logits.element_size() < 4 else logits


def _chunk_stats(head: nn.Module, h: torch.Tensor, targets: torch.Tensor, inv_temp: float,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and entropy for one chunk of hidden states h: (N, H), targets: (N,) (generic head)."""
    return _stats(_upcast(head(h)), targets, inv_temp, with_entropy)[:2]


def _stats(logits: torch.Tensor, targets: torch.Tensor, inv_temp: float, with_entropy: bool
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log p(target), entropy (zeros without ``with_entropy``), logsumexp) (N,) of (N, V) logits at temperature
    1 / inv_temp."""
    if inv_temp != 1.0:
        logits = logits * inv_temp
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lp, torch.zeros_like(lp), lse
    p = torch.softmax(logits, dim=-1)
    ent = lse - (p * logits if p.requires_grad else p.mul_(logits)).sum(-1)  # in place: same bits, one buffer less
    return lp, ent, lse


def _dense_grad(logits: torch.Tensor, owned: bool, lse: torch.Tensor, ent: torch.Tensor, g_lp: torch.Tensor,
                g_ent: torch.Tensor | None, inv_temp: float) -> torch.Tensor:
    """Gradient w.r.t. the (unscaled) logits (N, V), in their dtype, except the one-hot term ``inv_temp * g_lp`` at
    each target (the caller adds it to the products). With z = logits * inv_temp and p = softmax(z):
    d lp / dz = onehot(target) - p, d H / dz = -p (z - lse + H) (as H = lse - sum p z); the temperature's chain
    multiplies by inv_temp. ``lse``, ``ent``, ``g_*``: (N,); ``owned``: ``logits`` may be overwritten."""
    col = lse.unsqueeze(-1)
    if inv_temp == 1.0:  # z - lse straight from the compute-dtype logits: one pass (the upcast is exact)
        d = logits.sub_(col) if owned and logits.element_size() >= 4 else torch.sub(logits, col)
    else:
        z = _upcast(logits)
        d = (z if owned or z is not logits else z.clone()).mul_(inv_temp).sub_(col)  # log p
    if g_ent is None:
        grad = d.exp_().mul_((-inv_temp * g_lp).unsqueeze(-1))
    else:
        grad = d.exp()  # p
        d.mul_((-inv_temp * g_ent).unsqueeze(-1)).add_((-inv_temp * (g_lp + g_ent * ent)).unsqueeze(-1))
        grad.mul_(d)
        del d
    if grad.dtype == logits.dtype:
        return grad
    return logits.copy_(grad) if owned else grad.to(logits.dtype)  # owned: into the logits' buffer, no new one


class _HeadChunk(torch.autograd.Function):
    """One chunk through a plain linear head: ``(log p(target), entropy)`` (N,) fp32 from h (N, H), weight (V, H),
    bias (V,) or None, targets (N,). Saves h, the per-row logsumexp and entropy, and with ``keep_logits`` the
    chunk's logits (in the compute dtype); backward recomputes the logits otherwise. Either way backward runs the
    same ops on the same logits, so both give the same gradients."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, inv_temp, with_entropy, keep_logits):
        logits = F.linear(h, weight, bias)  # under the caller's autocast, as head(h): its dtype is the compute dtype
        ctx.dtype, ctx.inv_temp, ctx.with_entropy = logits.dtype, inv_temp, with_entropy
        kept = logits if keep_logits else None
        z = _upcast(logits)
        del logits  # a bf16 chunk is not held beside its fp32 copy unless kept
        lp, ent, lse = _stats(z, targets, inv_temp, with_entropy)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(h, weight, bias, targets, lse, ent, kept)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h, weight, bias, targets, lse, ent, logits = ctx.saved_tensors
        dt, inv_temp = ctx.dtype, ctx.inv_temp
        hc, wc = h.to(dt), weight.to(dt)
        owned = logits is None
        if owned:
            with torch.autocast(h.device.type, enabled=False):
                logits = F.linear(hc, wc, None if bias is None else bias.to(dt))
        g_lp = torch.zeros_like(lse) if g_lp is None else g_lp
        grad = _dense_grad(logits, owned, lse, ent, g_lp, g_ent if ctx.with_entropy else None, inv_temp)
        del logits
        onehot = (inv_temp * g_lp).unsqueeze(-1)  # the target's term, added to the products row by row
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_h = (grad @ wc).to(h.dtype).addcmul_(onehot, wc[targets])  # computed in fp32, rounded once
        if ctx.needs_input_grad[1]:
            grad_w = (grad.t() @ hc).to(weight.dtype).index_add_(0, targets, (onehot * hc).to(weight.dtype))
        if ctx.needs_input_grad[2]:
            grad_b = grad.sum(0).to(bias.dtype).index_add_(0, targets, onehot.squeeze(-1).to(bias.dtype))
        return grad_h, grad_w, grad_b, None, None, None, None


def _plain_linear(head: nn.Module) -> bool:
    """True for an ``nn.Linear`` head (not a subclass, no hooks) with plain tensor parameters: ``_HeadChunk`` may
    read its weight and bias instead of calling it."""
    if type(head) is not nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return False
    return all(type(p) in (nn.Parameter, torch.Tensor) for p in (head.weight, head.bias) if p is not None)


def log_probs_from_hidden(head: nn.Module, hidden: torch.Tensor, input_ids: torch.Tensor,
                          target_mask: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024,
                          with_entropy: bool = False, checkpoint: bool = True, fused: bool = True
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs from hidden states; see ``token_log_probs``. hidden: (B, T, H); masks (B, T).

    ``fused=False`` runs the generic path (autograd through ``head(h)``) even for a plain linear head: same values,
    gradients equal up to float rounding (benchmarks and tests compare the two)."""
    B, T = input_ids.shape
    sel = target_mask.bool().clone()
    sel[:, 0] = False  # nothing predicts the first token
    idx = sel.nonzero(as_tuple=True)  # positions t whose token is predicted from hidden state t - 1
    h = hidden[idx[0], idx[1] - 1]  # (N, H)
    targets = input_ids[idx]
    inv_temp = 1.0 / float(temperature)
    use_ckpt = checkpoint and torch.is_grad_enabled() and h.requires_grad
    fused = fused and _plain_linear(head)
    lps, ents = [], []
    # at least one (possibly empty) chunk, so the graph reaches every parameter even with nothing selected:
    # under FSDP2 every rank must run the same backward (its reduce-scatters) whatever its mask holds
    for s in range(0, max(h.shape[0], 1), chunk_size):
        hs, ts = h[s:s + chunk_size], targets[s:s + chunk_size]
        if fused:  # the head's parameters as head(h) would read them (FSDP2: unsharded inside the root's forward)
            lp, ent = _HeadChunk.apply(hs, head.weight, head.bias, ts, inv_temp, with_entropy, not checkpoint)
        elif use_ckpt:
            lp, ent = _checkpoint(_chunk_stats, head, hs, ts, inv_temp, with_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_stats(head, hs, ts, inv_temp, with_entropy)
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
    logits in backward so peak memory is one chunk of logits, not B*T*V (``False``: every chunk's logits are
    kept for backward; same numbers).
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
