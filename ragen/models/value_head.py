"""Critic model: a causal LM's transformer backbone plus a scalar value head at every position.

``ValueModel`` owns its weights (a copy of the policy's base model by default, as in RAGEN / verl where the
critic starts from the actor's checkpoint) and a ``Linear(hidden, 1)`` head initialised to zero, so the
first values are exactly 0 and the first updates move only the head until it carries signal.
Saved as a transformers folder (the backbone, loadable with ``AutoModel.from_pretrained``) plus
``value_head.safetensors``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

from ragen.models.forward import hidden_states

HEAD_FILE = "value_head.safetensors"


def values_from_hidden(head: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values (B, T), last_values (B,))`` fp32 from hidden states ``hidden: (B, T, H)`` and a scalar ``head``,
    in ``ValueModel``'s position convention: ``values[:, t] = head(hidden[:, t - 1])`` (V of the context before
    token t) where t - 1 and t are real tokens, else 0; ``last_values[b]`` = head on row b's last real token (V
    after the whole row; 0 for an empty row). Shared by the critic and the actor's value head
    (``critic.share_backbone``)."""
    after = head(hidden.to(head.weight.dtype)).squeeze(-1).float()  # after[:, t]: has read token t
    real = attention_mask > 0
    prev_real = F.pad(real[:, :-1], (1, 0), value=False)
    values = torch.where(real & prev_real, F.pad(after[:, :-1], (1, 0)), 0.0)
    T = real.shape[1]
    last = (real * torch.arange(1, T + 1, device=real.device)).argmax(dim=1)  # last real position (0: none)
    last_values = torch.where(real.any(dim=1), after.gather(1, last[:, None]).squeeze(1), 0.0)
    return values, last_values


def zero_value_head(hidden_size: int) -> nn.Linear:
    """``Linear(hidden_size, 1)`` with zero weight and bias: the first values are exactly 0."""
    head = nn.Linear(hidden_size, 1)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    return head


class ValueModel(nn.Module):
    """A scalar value head on a causal LM's backbone; ``forward`` returns (values, last_values), fp32.

    ``backbone``: the base model of a ``*ForCausalLM`` (``model.model``), i.e. without its lm_head.
    Position convention (the one every estimator reads, as in verl / OpenRLHF / TRL): ``values[:, t]`` is V of
    the context *before* token t, the head on the hidden state at t - 1 -- the same position the policy's
    log-prob of token t comes from. So the value of a model token's state has not read that token (the head on
    hidden[t] itself would be Q(s_t, a_t): a baseline that already contains the action cancels its advantage).
    ``values[:, 0] = 0``, and so is every position whose previous position is padding. ``last_values`` (B,) is
    the head on the last real token: V of the state after the whole sequence, which no position of ``values``
    holds; it is the bootstrap of rows cut by a length budget. The shift happens here, per row, so in the
    ``turn`` layout each turn sample is shifted inside itself before any gather.
    """

    def __init__(self, backbone: PreTrainedModel, head_init_std: float = 0.0):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        with torch.no_grad():
            if head_init_std > 0:
                self.head.weight.normal_(0.0, head_init_std)
            else:
                self.head.weight.zero_()
            self.head.bias.zero_()

    @classmethod
    def from_causal_lm(cls, lm: PreTrainedModel, head_init_std: float = 0.0) -> ValueModel:
        """Take ``lm``'s backbone (its weights are reused, not copied: pass a fresh load to keep the policy)."""
        backbone = getattr(lm, "model", None) or getattr(lm, "transformer", None)
        if backbone is None:
            raise TypeError(f"{type(lm).__name__} has no .model/.transformer backbone; pass a *ForCausalLM model")
        return cls(backbone, head_init_std=head_init_std)

    @property
    def layers(self) -> nn.ModuleList:
        """The decoder layers (FSDP2 shards each one)."""
        return self.backbone.layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask: (B, T) (right or left padded) -> (values (B, T), last_values (B,)), fp32.

        See the class docstring for the positions: ``values[:, t] = head(hidden[t - 1])`` where both t - 1 and t
        are real tokens (0 elsewhere); ``last_values[b] = head(hidden[last real token of row b])`` (0 for an empty
        row).
        """
        return values_from_hidden(self.head, hidden_states(self.backbone, input_ids, attention_mask), attention_mask)

    def save(self, directory: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Write the backbone (``save_pretrained``) and the head to ``directory``.

        ``state`` is an optional full state dict of this module (e.g. gathered from FSDP shards); by default
        the module's own parameters are written.
        """
        directory = Path(directory)
        state = state if state is not None else self.state_dict()
        backbone = {k[len("backbone."):]: v.contiguous() for k, v in state.items() if k.startswith("backbone.")}
        head = {k[len("head."):]: v.contiguous() for k, v in state.items() if k.startswith("head.")}
        self.backbone.save_pretrained(directory, state_dict=backbone)
        save_file(head, str(directory / HEAD_FILE))

    @classmethod
    def load(cls, directory: str | Path, dtype: torch.dtype = torch.float32,
             attn_implementation: str | None = None) -> ValueModel:
        """Inverse of ``save``; ``attn_implementation`` as in ``ragen.models.load_model`` (None: ``sdpa``)."""
        directory = Path(directory)
        if not (directory / HEAD_FILE).is_file():
            raise FileNotFoundError(f"{directory} has no {HEAD_FILE}; expected a folder written by ValueModel.save")
        model = cls(AutoModel.from_pretrained(directory, dtype=dtype, attn_implementation=attn_implementation))
        model.head.load_state_dict(load_file(str(directory / HEAD_FILE)))
        return model.to(dtype)
