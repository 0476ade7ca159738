"""ChatFormat derivation from a chat template and its error on templates that cannot be built incrementally."""

from __future__ import annotations

import pytest
from conftest import make_char_tokenizer

from ragen.agent import ChatFormat


def test_derived_tokens_and_renderings(char_tok):
    fmt = ChatFormat(char_tok, system_prompt="Be brief.")
    assert fmt.eot_id == char_tok.convert_tokens_to_ids("<|end|>")
    assert char_tok.decode(fmt.separator_ids) == "\n"
    assert char_tok.decode(fmt.first_prompt("hi")) == "<s><|system|>Be brief.<|end|>\n<|user|>hi<|end|>\n<|assistant|>"
    assert char_tok.decode(fmt.next_message("yo")) == "<|user|>yo<|end|>\n<|assistant|>"
    assert len(fmt.next_message("yo")) == 6  # <|user|> y o <|end|> \n <|assistant|>
    assert fmt.decode(fmt.encode("a<|end|>")) == "a"


def test_template_without_end_token_falls_back_to_eos():
    tok = make_char_tokenizer()
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }};{% endfor %}"
    fmt = ChatFormat(tok)
    assert fmt.eot_id == tok.eos_token_id and tok.decode(fmt.separator_ids) == ";"


def test_unstable_template_and_missing_template_errors():
    tok = make_char_tokenizer()
    tok.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}<|end|>{% endfor %}"
    with pytest.raises(ValueError, match="re-renders earlier messages"):
        ChatFormat(tok).next_message("x")
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(tok)
