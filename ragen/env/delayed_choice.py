"""Delayed choice: a multi-turn test of credit assignment across turns.

Turn 1 offers two doors; each later turn offers two chests that change nothing. The episode's only reward comes
after the last turn: ``payout`` if the door picked at turn 1 was ``good_door``, else 0. So the decisive action
is the *first* one and its reward arrives ``num_turns - 1`` turns later, on a turn whose own choice is noise:

* a method that carries the final reward back across turns (bi-level or turn-level GAE with gamma_H > 0, GRPO-
  family outcome advantages) can learn to open the good door;
* one that cannot (turn-level GAE with gamma_H = 0: turn 1's target is its own reward, always 0) cannot, and a
  method that credits only the last turn reinforces the irrelevant chest instead.

The option order is shuffled by the seed, and nothing in the text says which door is good: it is learnt from
reward alone (like the bandit's arms). Any answer that is not one of the offered options ends the episode with
reward 0 (``action_is_valid=False``). Deterministic per seed; no randomness in the reward. Every step reports
the step / outcome split of MS-GRPO: step reward 0 on every turn, the outcome reward on the last one, and no tool
result (``tool_result=False``: there is no tool).
Expert (``expert_action``): ``good_door`` on the first turn, then the first chest offered (chests change nothing).
"""

from __future__ import annotations

import random

from ragen.env.base import StepResult, register
from ragen.env.text_utils import finished_step, match_choice, require_active, require_reset, step_info


def _split(outcome: float) -> dict[str, object]:
    """The step / outcome split of one step: no step reward and no tool result ever, ``outcome`` at the end."""
    return {"step_reward": 0.0, "outcome_reward": outcome, "tool_result": False}


@register("delayed_choice")
class DelayedChoiceEnv:
    """``num_turns`` two-way choices; reward ``payout`` after the last one iff the first was ``good_door``."""

    DEFAULT_MAX_TURN = 2  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    STEP_OUTCOME_SPLIT = True  # info carries step_reward / outcome_reward (MS-GRPO, MS-PO)

    def __init__(
        self,
        doors: tuple[str, str] | list[str] = ("left", "right"),
        good_door: str = "right",
        chests: tuple[str, str] | list[str] = ("gold", "silver"),
        num_turns: int = 2,
        payout: float = 1.0,
    ) -> None:
        doors, chests = [str(d).strip() for d in doors], [str(c).strip() for c in chests]
        for label, pair in (("doors", doors), ("chests", chests)):
            if len(pair) != 2 or not all(pair) or pair[0].lower() == pair[1].lower():
                raise ValueError(f"delayed_choice {label} must be two different non-empty names, got {pair!r}")
        if match_choice(good_door, doors) is None:
            raise ValueError(f"delayed_choice good_door={good_door!r} must be one of the doors {doors}")
        if int(num_turns) < 1:
            raise ValueError(f"delayed_choice num_turns must be >= 1, got {num_turns}")
        self.doors, self.chests = doors, chests
        self.good_door = match_choice(good_door, doors)
        self.num_turns, self.payout = int(num_turns), float(payout)
        self.instructions = (
            "You are exploring a castle. First you choose one of two doors; after that you choose chests. "
            "Only the door decides whether you find the treasure, and you learn it at the very end. "
            "Answer each question with exactly one of the names offered, e.g. "
            f"{self.doors[0]}."
        )
        self._options: list[str] = []
        self._turn = 0
        self._door: str | None = None
        self._done = False
        self._started = False
        self._rng = random.Random(0)

    def reset(self, seed: int) -> str:
        self._rng = random.Random(seed)
        self._turn, self._door, self._done, self._started = 0, None, False, True
        self._options = self._shuffled(self.doors)
        return self._render()

    def legal_actions(self) -> str:
        return ", ".join(self.action_list())

    def action_list(self) -> list[str]:
        """The doors on the first turn, then the chests offered."""
        return list(self._options or self.doors)

    def expert_action(self) -> str:
        """``good_door`` on the first turn, then the first chest offered (any chest is as good)."""
        require_active(self._started, self._done, "delayed_choice")
        return self.good_door if self._turn == 0 else self._options[0]

    def step(self, action: str) -> StepResult:
        require_reset(self._started, "delayed_choice")
        if self._done:
            return finished_step("The episode is over.", self._success())
        choice = match_choice(action, self._options)
        if choice is None:
            self._done = True
            obs = f"Invalid answer {str(action)[:40]!r}: the options were {self.legal_actions()}. The episode is over."
            return StepResult(obs, 0.0, True, step_info(False, False, False, **_split(0.0)))
        if self._turn == 0:
            self._door = choice
        self._turn += 1
        if self._turn >= self.num_turns:
            self._done = True
            reward = self.payout if self._success() else 0.0
            obs = f"You opened {choice}. " + ("You found the treasure!" if reward else "The castle is empty.")
            info = step_info(True, True, self._success(), door=self._door, **_split(reward))
            return StepResult(obs, reward, True, info)
        self._options = self._shuffled(self.chests)
        info = step_info(True, True, False, **_split(0.0))
        return StepResult(f"You opened {choice}. " + self._render(), 0.0, False, info)

    def _success(self) -> bool:
        return self._door == self.good_door

    def _shuffled(self, pair: list[str]) -> list[str]:
        order = list(pair)
        self._rng.shuffle(order)
        return order

    def _render(self) -> str:
        kind = "Doors" if self._turn == 0 else "Chests"
        what = "door" if self._turn == 0 else "chest"
        return f"{kind}: {', '.join(self._options)}. Which {what} do you open?"
