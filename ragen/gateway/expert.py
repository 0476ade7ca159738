"""A scripted engine for demonstrations: the program's expert writes each answer, the gateway records it as a sample.

A warm start of an agent program (``trainer.sft_warmup_steps`` with ``env.config.expert``, docs/gateway.md) runs
the program as RL does, against a gateway whose engine is an :class:`ExpertEngine`: for every call, the expert
``expert(prompt_text) -> answer_text`` reads the prompt as the model would see it (the template's rendering,
special tokens included) and returns the text the model should write. The answer's ids (tokenised on their own,
then the stop id) are the call's sample, so the demonstrations pass through the same endpoint, records, merge rule
and rows as the model's own samples, and behaviour cloning trains on exactly those tokens after exactly those
prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ragen.rollout.base import Sample, SamplingParams

Expert = Callable[[str], str]


class ExpertEngine:
    """The ``Engine`` protocol's ``generate`` over an expert (module docstring). ``stop_id``: the token appended
    to every answer (the template's end-of-turn token, as the engines keep the stop token they stopped at). An
    answer longer than the call's token budget is cut to it (``finish_reason`` ``length``, no stop id). Log-probs
    are 0.0 (a demonstration has none; behaviour cloning does not read them). ``stats``: the warm start's
    counters, as ``ragen.agent.expert.ExpertResponder`` keeps them (an expert has no random turns: 0)."""

    def __init__(self, tokenizer: Any, expert: Expert, stop_id: int) -> None:
        self.tokenizer = tokenizer
        self.expert = expert
        self.stop_id = int(stop_id)
        self.stats = {"noise_turns": 0}

    def sample(self, prompt_ids: Sequence[int], budget: int) -> Sample:
        """The expert's answer to one prompt, as a sample of at most ``budget`` tokens."""
        text = self.expert(self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        ids = list(self.tokenizer(str(text), add_special_tokens=False)["input_ids"]) + [self.stop_id]
        finish = "stop" if len(ids) <= budget else "length"
        ids = ids[:budget]
        return Sample(ids, [0.0] * len(ids), finish)

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        return [self.sample(p, sampling.max_new_tokens) for p in prompt_token_ids]
