"""Model loading (packaged default, local folders, hub ids) and tiny test models.

``value_head`` (critic models) lives beside these and is imported from its own module.
"""

from ragen.models.loader import DEFAULT_MODEL, export_tokenizer, load_model, load_tokenizer, resolve_model_path
from ragen.models.tiny import tiny_model

__all__ = ["DEFAULT_MODEL", "export_tokenizer", "load_model", "load_tokenizer", "resolve_model_path", "tiny_model"]
