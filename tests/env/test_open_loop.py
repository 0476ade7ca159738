"""The open-loop bound: the best score of a policy that never reads the observation, computed exactly."""

from __future__ import annotations

import pytest

import ragen.env as E
from ragen.env import StepResult
from ragen.evaluation.open_loop import best_fixed_plan, top_guesses_bound


class TwoDoors:
    """Seed s hides the prize behind door ``"ab"[s % 2]``; a wrong door ends the episode when ``strict``, else it
    only costs a turn. The observation never says where the prize is."""

    def __init__(self, strict: bool):
        self.strict = strict

    def reset(self, seed: int) -> str:
        self.prize = "ab"[seed % 2]
        return "two doors"

    def legal_actions(self) -> str:
        return "a, b"

    def step(self, action: str) -> StepResult:
        won = action == self.prize
        return StepResult("two doors", float(won), won or self.strict, {"success": won})


@pytest.mark.parametrize(("strict", "depth", "wins", "plan"), [
    (True, 1, 2, ("a",)), (True, 2, 2, ("a",)),   # a wrong door ends it: one guess, half the panel
    (False, 1, 2, ("a",)), (False, 2, 4, ("a", "b")),  # a second try wins the other half
])
def test_best_fixed_plan_by_hand(strict, depth, wins, plan):
    b = best_fixed_plan(lambda: TwoDoors(strict), [0, 1, 2, 3], ["a", "b"], depth, markov=False)
    assert (b.wins, b.n, b.plan) == (wins, 4, plan)


def test_frozen_lake_3x3_validation_panel():
    """The 32 validation maps of the FrozenLake launch scripts (seeds 100000..100031): the best plan of up to 15
    moves (3 turns of 5) is Right, Down, Down, Right and wins 22 of them (0.6875); reading the map wins all."""
    from ragen.env.frozen_lake import ACTIONS

    b = best_fixed_plan(lambda: E.make("frozen_lake", size=3), range(100000, 100032), ACTIONS, depth=15)
    assert (b.wins, b.n, b.plan) == (22, 32, ("Right", "Down", "Down", "Right"))


def test_top_guesses_bound_by_hand():
    # elephant 4, dog 3, apple/bee/chair/spoon 2, car 1 (16 games): four fixed guesses win 4 + 3 + 2 + 2 = 11
    panel = ["elephant"] * 4 + ["dog"] * 3 + ["bee", "apple", "chair", "spoon"] * 2 + ["car"]
    score, guesses = top_guesses_bound(panel, 4)
    assert score == pytest.approx(11 / 16) and guesses == ["elephant", "dog", "apple", "bee"]
    assert top_guesses_bound(["x", "y"], 4) == (1.0, ["x", "y"])  # fewer distinct secrets than turns: bound 1
