"""Fixtures for the agent-proxy tests: a char-level tokenizer with a chat template, a scripted engine, fake envs.

The tokenizer maps every character to one id and each special token to one id, so token positions in the
tests can be counted by hand; its template is deliberately unlike any real model family's.
"""

from __future__ import annotations

import string
from collections.abc import Callable

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ragen.env import StepResult, register
from ragen.rollout.base import Sample, SamplingParams

SPECIALS = ["<pad>", "<unk>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
TEMPLATE = (
    "<s>{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_char_tokenizer() -> PreTrainedTokenizerFast:
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


@pytest.fixture(scope="session")
def char_tok() -> PreTrainedTokenizerFast:
    return make_char_tokenizer()


class ScriptedEngine:
    """Returns scripted responses; records every prompt it was given.

    ``script(call_index, prompt_index, prompt_ids) -> list[int]`` gives the sampled ids; log-prob of the j-th
    sampled token of a call is ``-(call + 1) * 0.01 - j * 0.001`` (distinct, checkable).
    """

    def __init__(self, script: Callable[[int, int, list[int]], list[int]]) -> None:
        self.script = script
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        call = len(self.calls)
        self.calls.append(([list(p) for p in prompt_token_ids], sampling))
        out = []
        for i, prompt in enumerate(prompt_token_ids):
            ids = list(self.script(call, i, list(prompt)))[: sampling.max_new_tokens]
            lps = [-(call + 1) * 0.01 - j * 0.001 for j in range(len(ids))]
            stop = bool(ids) and ids[-1] in sampling.stop_token_ids
            out.append(Sample(ids, lps, "stop" if stop else "length"))
        return out

    def update_weights(self, state_dict) -> None:  # noqa: ANN001 - protocol stub, nothing to update
        return None

    def sleep(self) -> None:
        return None

    def wake(self) -> None:
        return None


@register("test_line")
class LineEnv:
    """Walk on a line with actions ``left``/``right``; reward of step j is ``rewards[j]``; done after ``horizon``.

    ``fail_on`` = "reset" / "step" raises in that call for odd seeds; ``split`` reports step/outcome rewards.
    """

    instructions = "Walk on a line."

    def __init__(
        self, rewards: tuple = (1.0, 0.0, 2.0), horizon: int = 3, fail_on: str = "", split: bool = False
    ) -> None:
        self.rewards, self.horizon, self.fail_on, self.split = tuple(rewards), horizon, fail_on, split
        self.pos, self.steps, self.seed = 0, 0, 0

    def reset(self, seed: int) -> str:
        self.pos, self.steps, self.seed = 0, 0, seed
        if self.fail_on == "reset" and seed % 2 == 1:
            raise RuntimeError(f"boom in reset (seed {seed})")
        return f"pos={self.pos}"

    def legal_actions(self) -> str:
        return "left, right"

    def step(self, action: str) -> StepResult:
        if self.fail_on == "step" and self.seed % 2 == 1:
            raise RuntimeError("boom in step")
        if action not in ("left", "right"):
            return StepResult(f"pos={self.pos}", 0.0, False, {"action_is_valid": False})
        self.pos += 1 if action == "right" else -1
        reward = self.rewards[self.steps % len(self.rewards)]
        self.steps += 1
        done = self.steps >= self.horizon
        info = {"action_is_valid": True, "action_is_effective": True, "success": done}
        if self.split:
            info.update(step_reward=reward, outcome_reward=10.0 if done else 0.0)
        return StepResult(f"pos={self.pos}", reward, done, info)
