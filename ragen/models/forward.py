"""The forward pass of a causal LM's base model: last hidden states with position ids from the attention mask.

Shared by everything that reads hidden states: the token log-probs of the policy (``ragen.workers.logprob``) and
the critic's values (``ragen.models.value_head``). A batch runs as one packed row where its attention implementation
takes a packing that pays (``ragen.models.packing``: shared prefixes once under ``sdpa`` / ``eager``, no padding under
``flash_attention_2``); unpacked right-padded rows drop the explicit mask, so the fused causal attention kernel runs.
"""

from __future__ import annotations

import torch
from torch import nn

from ragen.models.packing import attention_mask_for, plan_packing, unpack, varlen_kwargs


def causal_lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(base model returning hidden states, lm_head) of a HF ``*ForCausalLM`` (tied embeddings work too)."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if base is None or head is None:
        raise TypeError(f"{type(model).__name__} is not a causal LM with .model/.transformer and an lm_head; "
                        "pass a transformers *ForCausalLM model")
    return base, head


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... over real tokens (works for right and left padding). (B, T) long."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is ones followed by zeros (then a plain causal mask is exact on real tokens)."""
    m = attention_mask.long()
    return bool((m[:, 1:] <= m[:, :-1]).all())


def hidden_states(base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states (B, T, H) of the base model, with position ids from the mask.

    Packed (``ragen.models.packing``, by the model's ``config._attn_implementation``) where the packing applies:
    the batch runs as one row that computes a shared prefix once (4D mask) or drops the padding (position ids).
    Otherwise right-padded batches drop the explicit mask: causal attention already hides the trailing padding from
    every real token, and the unmasked path uses the fast fused causal kernel.
    """
    impl = getattr(getattr(base, "config", None), "_attn_implementation", None)
    plan = plan_packing(input_ids, attention_mask, impl)
    if plan is not None:
        dtype = base.get_input_embeddings().weight.dtype
        out = base(input_ids=plan.ids, attention_mask=attention_mask_for(plan, impl, dtype),
                   position_ids=plan.positions, use_cache=False, **varlen_kwargs(plan, impl))
        return unpack(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0], plan)
    mask = None if is_right_padded(attention_mask) else attention_mask
    out = base(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(attention_mask),
               use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
