"""Envs that break the env protocol in the ways a user's first env tends to (tests/env/test_smoke.py): each is a
copy of a working one-step env with one defect. Imported as ``broken_envs`` (pytest puts this folder on sys.path)."""

from __future__ import annotations

from ragen.env import StepResult, register


class _Fine:
    instructions = "Say yes."

    def reset(self, seed: int) -> str:
        return "Say yes."

    def legal_actions(self) -> str:
        return "yes | no"

    def step(self, action: str) -> StepResult:
        won = action.strip() == "yes"
        return StepResult("done", float(won), True, {"action_is_valid": action.strip() in ("yes", "no"),
                                                     "action_is_effective": True, "success": won})


@register("smoke_fine")
class Fine(_Fine):
    pass


@register("smoke_tuple_step")
class TupleStep(_Fine):
    def step(self, action: str):  # gymnasium's habit: (observation, reward, terminated, truncated, info)
        return "done", 1.0, True, False, {}


@register("smoke_no_legal_actions")
class NoLegalActions:
    instructions = "Say yes."

    def reset(self, seed: int) -> str:
        return "Say yes."

    def step(self, action: str) -> StepResult:
        return StepResult("done", 0.0, True, {})

    def expert_action(self) -> str:
        return "yes"


@register("smoke_step_raises")
class StepRaises(_Fine):
    def step(self, action: str) -> StepResult:
        raise KeyError(action)


@register("smoke_string_reward")
class StringReward(_Fine):
    def step(self, action: str) -> StepResult:
        return StepResult("done", "0", True, {})
