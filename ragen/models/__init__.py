"""Model loading (packaged default, local folders, hub ids) and tiny test models.

Beside these, each imported from its own module: ``value_head`` (critic models), ``forward`` (the base model's
hidden states, shared by the policy's log-probs and the critic's values), ``packing`` (a batch's rows as one packed
row, in the layout the attention implementation takes) and ``attention`` (which attention implementation the
trainer's models run: ``model.attn_implementation``).
"""

from ragen.models.loader import DEFAULT_MODEL, export_tokenizer, load_model, load_tokenizer, resolve_model_path
from ragen.models.tiny import tiny_model

__all__ = ["DEFAULT_MODEL", "export_tokenizer", "load_model", "load_tokenizer", "resolve_model_path", "tiny_model"]
