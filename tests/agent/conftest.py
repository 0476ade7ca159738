"""Fixtures for the agent-proxy tests: ``char_tok`` (a char-level fast tokenizer with special tokens and a chat
template, from agent_helpers.py) and the ``test_line`` env registered on import. The scripted engine is the root
conftest's ``fake_engine``; never ``from conftest import ...``.
"""

from __future__ import annotations

import pytest
from agent_helpers import make_char_tokenizer
from transformers import PreTrainedTokenizerFast

from ragen.env import StepResult, register


@pytest.fixture(scope="session")
def char_tok() -> PreTrainedTokenizerFast:
    return make_char_tokenizer()


@register("test_line")
class LineEnv:
    """Walk on a line with actions ``left``/``right``; reward of step j is ``rewards[j]``; done after ``horizon``.

    ``fail_on`` = "reset" / "step" raises in that call for odd seeds; ``split`` reports step/outcome rewards, and
    ``tool_result`` = ``tools[j]`` on step j when ``tools`` is given (cycled like ``rewards``).
    """

    instructions = "Walk on a line."

    def __init__(
        self, rewards: tuple = (1.0, 0.0, 2.0), horizon: int = 3, fail_on: str = "", split: bool = False,
        tools: tuple = (),
    ) -> None:
        self.rewards, self.horizon, self.fail_on, self.split = tuple(rewards), horizon, fail_on, split
        self.tools = tuple(tools)
        self.pos, self.steps, self.seed = 0, 0, 0

    def reset(self, seed: int) -> str:
        self.pos, self.steps, self.seed = 0, 0, seed
        if self.fail_on == "reset" and seed % 2 == 1:
            raise RuntimeError(f"boom in reset (seed {seed})")
        return f"pos={self.pos}"

    def legal_actions(self) -> str:
        return "left, right"

    def action_list(self) -> list[str]:
        return ["left", "right"]

    def expert_action(self) -> str:
        """The expert walks right (the rewarded direction of this test env)."""
        return "right"

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
            if self.tools:
                info.update(tool_result=bool(self.tools[(self.steps - 1) % len(self.tools)]))
        return StepResult(f"pos={self.pos}", reward, done, info)
