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
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """values = head(backbone(input_ids).last_hidden_state), shape (B, T), fp32.

    ``backbone``: the base model of a ``*ForCausalLM`` (``model.model``), i.e. without its lm_head.
    ``values[:, t]`` is V(s_t), the value of the state after reading tokens 0..t.
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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (B, T) (right or left padded) -> values (B, T) fp32, 0 on padding."""
        from ragen.workers.logprob import hidden_states

        hidden = hidden_states(self.backbone, input_ids, attention_mask)
        values = self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()
        return values * attention_mask.to(values.dtype)

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
    def load(cls, directory: str | Path, dtype: torch.dtype = torch.float32) -> ValueModel:
        """Inverse of ``save``."""
        directory = Path(directory)
        if not (directory / HEAD_FILE).is_file():
            raise FileNotFoundError(f"{directory} has no {HEAD_FILE}; expected a folder written by ValueModel.save")
        model = cls(AutoModel.from_pretrained(directory, dtype=dtype))
        model.head.load_state_dict(load_file(str(directory / HEAD_FILE)))
        return model.to(dtype)
