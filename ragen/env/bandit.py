"""Two-armed bandit: a single-turn test of whether the agent prefers the arm with the higher expected payout.

The low-risk arm always pays ``low_payout`` (0.1); the high-risk arm pays ``high_payout`` (1.0) with
probability ``high_prob`` (0.25), else 0, so its expected value (0.25) is higher. The observation lists the
two arm names in an order shuffled by the seed, and says nothing about which is which: the names carry the
only hint (RAGEN's "phoenix" vs "dragon").

Episode: one valid pull ends the episode. An invalid action also ends it, with reward 0 and
``action_is_valid=False`` (the env is single-turn: there is no second chance, like a wrong answer).
Determinism: the arm order and the high arm's payout draw both come from ``random.Random(seed)``.
Expert (``expert_action``): the high arm (the higher expected payout).
The instructions give no example answer: an example naming one arm ("e.g. phoenix") is a hint a small model
copies, and RL then never samples the other arm (the default model answered phoenix in all of 96 training
episodes of a PPO run once the format was learnt).
"""

from __future__ import annotations

import random

from ragen.env.base import StepResult, register
from ragen.env.text_utils import finished_step, match_choice, require_active, require_reset, step_info


@register("bandit")
class BanditEnv:
    """Single-turn two-armed bandit; ``info["success"]`` is True when the high-risk arm was pulled."""

    DEFAULT_MAX_TURN = 1  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    def __init__(
        self,
        low_arm: str = "phoenix",
        high_arm: str = "dragon",
        low_payout: float = 0.1,
        high_payout: float = 1.0,
        high_prob: float = 0.25,
    ) -> None:
        low_arm, high_arm = str(low_arm).strip(), str(high_arm).strip()
        if not low_arm or not high_arm or low_arm.lower() == high_arm.lower():
            raise ValueError(f"bandit arm names must be two different non-empty names, got {low_arm!r}, {high_arm!r}")
        if not 0.0 <= high_prob <= 1.0:
            raise ValueError(f"bandit high_prob must be in [0, 1], got {high_prob}")
        self.low_arm, self.high_arm = low_arm, high_arm
        self.low_payout, self.high_payout, self.high_prob = float(low_payout), float(high_payout), float(high_prob)
        self.instructions = (
            "You are playing a two-armed bandit. Goal: get the highest expected reward. One arm pays a small "
            "reward every time; the other pays a large reward only sometimes, and its expected reward is "
            "higher. The observation lists the two arm names; their symbolic meaning hints at how each arm "
            "pays. You get a single pull. Answer with the name of one of the two arms."
        )
        self._order: list[str] = []
        self._high_wins = False
        self._done = False
        self._success = False
        self._started = False

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self._order = [self.low_arm, self.high_arm]
        rng.shuffle(self._order)
        self._high_wins = rng.random() < self.high_prob
        self._done = self._success = False
        self._started = True
        return self._render()

    def legal_actions(self) -> str:
        return ", ".join(self.action_list())

    def action_list(self) -> list[str]:
        """The two arms, in the order the prompt shows them."""
        return list(self._order or [self.low_arm, self.high_arm])

    def expert_action(self) -> str:
        """The high-risk arm: its expected payout is the higher one."""
        require_active(self._started, self._done, "bandit")
        return self.high_arm

    def step(self, action: str) -> StepResult:
        require_reset(self._started, "bandit")
        if self._done:
            return finished_step("The episode is over.", self._success)
        self._done = True
        arm = match_choice(action, self._order)
        if arm is None:
            obs = f"Invalid action {str(action)[:40]!r}: the arms are {self.legal_actions()}. The episode is over."
            return StepResult(obs, 0.0, True, step_info(False, False, False))
        if arm == self.high_arm:
            reward = self.high_payout if self._high_wins else 0.0
        else:
            reward = self.low_payout
        self._success = arm == self.high_arm
        obs = f"You pulled {arm} and received reward {reward:g}."
        return StepResult(obs, reward, True, step_info(True, True, self._success, arm=arm))

    def _render(self) -> str:
        return f"Arms: {', '.join(self._order)}. Which arm do you pull?"
