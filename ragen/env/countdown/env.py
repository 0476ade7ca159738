"""Countdown as a single-turn text environment: reach the target with the given numbers.

The answer is an arithmetic expression (``+ - * /``, parentheses, integer literals) that uses each given
number **exactly once** (as in TinyZero/RAGEN Countdown), e.g. ``(25 - 5) * 3 + 4``; a trailing
``= result`` is allowed and ignored. It is checked by ``expression.parse_expression`` (a tokenizer and a
recursive-descent parser over exact fractions), never by Python ``eval``.

Rewards (``info["outcome"]`` names the case):
* 1.0 ``correct``: the numbers used are exactly the given multiset and the value equals the target;
* 0.1 ``wrong``: well-formed, but other numbers, or another value (a division by zero has no value);
* 0.0 ``malformed``: not an expression of the grammar (names, ``**``, unary minus, free text, ...).
Any answer ends the episode. ``action_is_valid`` = well-formed; ``success`` = correct.

Expert (``expert_action``): the reference solution the generator built with the puzzle (``Puzzle.solution``).
"""

from __future__ import annotations

import random
from collections import Counter

from ragen.env.base import StepResult, register
from ragen.env.countdown.expression import MalformedExpression, parse_expression
from ragen.env.countdown.generator import Puzzle, generate_puzzle
from ragen.env.text_utils import finished_step, require_active, require_reset, step_info

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1


@register("countdown")
class CountdownEnv:
    """Reach ``target`` with an expression over the given numbers (see the module docstring)."""

    DEFAULT_MAX_TURN = 1  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    def __init__(self, num_numbers: int = 4, min_number: int = 1, max_number: int = 50, max_target: int = 1000) -> None:
        if not 2 <= int(num_numbers) <= 6:
            raise ValueError(f"countdown num_numbers must be in [2, 6], got {num_numbers}")
        if not 1 <= int(min_number) <= int(max_number):
            raise ValueError(f"countdown needs 1 <= min_number <= max_number, got {min_number}, {max_number}")
        if int(max_target) < int(num_numbers) * int(max_number):
            raise ValueError(
                f"countdown max_target={max_target} is below num_numbers * max_number = "
                f"{int(num_numbers) * int(max_number)}; raise max_target so every draw has a reachable target"
            )
        self.num_numbers, self.min_number = int(num_numbers), int(min_number)
        self.max_number, self.max_target = int(max_number), int(max_target)
        self.instructions = (
            "You are given numbers and a target. Write an arithmetic expression that uses each given number "
            "exactly once, with + - * / and parentheses, and evaluates to the target. Answer with the "
            "expression only, for example (25 - 5) * 3 + 4."
        )
        self.puzzle: Puzzle | None = None
        self._done = False
        self._success = False

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.puzzle = generate_puzzle(rng, self.num_numbers, self.min_number, self.max_number, self.max_target)
        self._done = self._success = False
        return f"Numbers: {', '.join(map(str, self.puzzle.numbers))}\nTarget: {self.puzzle.target}"

    def legal_actions(self) -> str:
        numbers = ", ".join(map(str, self.puzzle.numbers)) if self.puzzle else "the given numbers"
        return f"one arithmetic expression using each of {numbers} exactly once, with + - * / and parentheses"

    def expert_action(self) -> str:
        """The generator's reference solution: uses each number exactly once and equals the target."""
        require_active(self.puzzle is not None, self._done, "countdown")
        return self.puzzle.solution

    def step(self, action: str) -> StepResult:
        require_reset(self.puzzle is not None, "countdown")
        if self._done:
            return finished_step("The episode is over.", self._success)
        self._done = True
        try:
            parsed = parse_expression(action if isinstance(action, str) else "")
        except MalformedExpression as err:
            return StepResult(
                f"Malformed answer: {err}.", 0.0, True, step_info(False, False, False, outcome="malformed")
            )
        if Counter(parsed.numbers) != Counter(self.puzzle.numbers):
            obs = f"Wrong: the answer must use each of {', '.join(map(str, self.puzzle.numbers))} exactly once."
            return StepResult(obs, FORMAT_REWARD, True, step_info(True, True, False, outcome="wrong"))
        if parsed.value != self.puzzle.target:
            shown = "undefined (division by zero)" if parsed.value is None else str(parsed.value)
            obs = f"Wrong: the expression equals {shown}, not {self.puzzle.target}."
            return StepResult(obs, FORMAT_REWARD, True, step_info(True, True, False, outcome="wrong"))
        self._success = True
        return StepResult("Correct!", CORRECT_REWARD, True, step_info(True, True, True, outcome="correct"))
