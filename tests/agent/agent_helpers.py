"""Helpers of the agent-proxy tests that tests build themselves (imported as ``from agent_helpers import ...``;
pytest puts this folder on ``sys.path``). Fixtures live in conftest.py; the scripted engine is the root
``fake_engine`` fixture.

The char tokenizer maps every character to one id and each special token to one id, so token positions in the
tests can be counted by hand; its template is deliberately unlike any real model family's.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<unk>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
TEMPLATE = (
    "<s>{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_char_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh char-level fast tokenizer with the ``TEMPLATE`` chat template (tests may change its template)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="<|end|>",
        additional_special_tokens=SPECIALS[4:],
    )  # fmt: skip
    fast.chat_template = TEMPLATE
    return fast


class Recorder:
    """Engine wrapper that keeps every call's prompts and samples: ``calls`` = [(prompts, samples), ...]."""

    def __init__(self, engine) -> None:  # noqa: ANN001 - any Engine
        self.engine, self.calls = engine, []

    def generate(self, prompts, sampling):  # noqa: ANN001, ANN201 - Engine protocol
        samples = self.engine.generate(prompts, sampling)
        self.calls.append(([list(p) for p in prompts], samples))
        return samples
