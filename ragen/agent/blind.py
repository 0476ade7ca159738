"""The observation-blind control of a learning claim (``agent.observations=blind``).

A policy that cannot read what the environment says can still learn a fixed plan, and on many panels a fixed plan
scores well (``ragen.evaluation.open_loop`` computes the best one). To show that a trained policy reads its
observations, the same training run is repeated with every observation replaced by a constant filler text of the
same token count: the prompts keep their length, their turn structure, the instructions and the legal actions, so
the compute and the sample budget stay the same, and only the state is hidden. A claim holds when the real run
beats both the open-loop bound and this control.
"""

from __future__ import annotations

from typing import Any

FILLER = "blank"  # one token per word after a space in the BPE vocabularies of Llama / Qwen / SmolLM2


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


def blind_text(observation: str, tokenizer: Any) -> str:
    """A constant text with as many tokens as ``observation`` (each counted alone, without special tokens).

    The filler is ``"blank blank ..."``, as many words as fit, then ``" ."`` or ``"."`` until the count matches
    (a BPE vocabulary matches with words alone; a character-level one needs the dots). It depends only on the
    observation's token count, so two states of the same length read the same.
    """
    target = _count(tokenizer, observation)
    for words in range(target, -1, -1):
        base = " ".join([FILLER] * words)
        gap = target - _count(tokenizer, base)
        if gap < 0:
            continue
        for unit in (" .", "."):
            for reps in range(gap + 1):
                text = (base + unit * reps).strip() if not base else base + unit * reps
                if _count(tokenizer, text) == target:
                    return text
    raise ValueError(f"cannot write {target} filler tokens with {tokenizer.__class__.__name__}")
