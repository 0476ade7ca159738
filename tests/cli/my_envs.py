"""The README's "Your environment" example, complete: a module a user puts on PYTHONPATH and names in ``imports``
(the documented-command test imports it as ``my_envs``; pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

from ragen.env import StepResult, register


@register("higher_lower")
class HigherLower:
    """Guess a number in 1..n; the answer says higher or lower; reward 1 on the right guess."""

    DEFAULT_MAX_TURN = 4
    instructions = "Guess the hidden whole number. After each guess you are told whether it is higher or lower."

    def __init__(self, n: int = 8) -> None:
        if int(n) < 2:
            raise ValueError(f"higher_lower n must be >= 2, got {n}")
        self.n, self.secret, self.done = int(n), 1, False

    def reset(self, seed: int) -> str:
        self.secret, self.done = seed % self.n + 1, False
        return f"A number between 1 and {self.n} is hidden."

    def legal_actions(self) -> str:
        return f"a whole number from 1 to {self.n}"

    def expert_action(self) -> str:
        return str(self.secret)

    def action_list(self) -> list[str]:
        return [str(k) for k in range(1, self.n + 1)]

    def step(self, action: str) -> StepResult:
        try:
            guess = int(action.strip())
        except ValueError:
            return StepResult("Not a number.", 0.0, False, {"action_is_valid": False})
        won = guess == self.secret
        text = "Correct!" if won else ("Higher." if guess < self.secret else "Lower.")
        return StepResult(text, float(won), won, {"action_is_valid": True, "action_is_effective": True,
                                                  "success": won})
