"""Sokoban as a text environment: push every box onto a target.

Grid legend: ``#`` wall, ``_`` empty floor, ``O`` target, ``X`` box, ``√`` box on a target, ``P`` player,
``S`` player on a target. Actions: ``Up``, ``Down``, ``Left``, ``Right`` (matched case-insensitively).

Rewards per valid action: -0.1 step cost, +1 when it pushes a box onto a target, -1 when it pushes one off,
+10 when all boxes are on targets (so the solving push earns -0.1 + 1 + 10 = 10.9). A valid move into a wall
costs the step cost and has ``action_is_effective=False``. An invalid action (not one of the four) costs
nothing, changes nothing and does not count towards ``max_steps``. The episode ends when solved or after
``max_steps`` valid actions. Rooms come from ``generator.generate_room`` with ``random.Random(seed)``.

Expert (``expert_action``): the first move of a shortest solution (``solver.solve``) from the current room. When
the room cannot be solved from here (a box is stuck, or the search exceeds its state budget), a move that changes
the player's cell without pushing a box if there is one (so no further damage is done), else any move.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ragen.env.base import StepResult, register
from ragen.env.sokoban.generator import generate_room
from ragen.env.sokoban.room import LEGEND, Room
from ragen.env.sokoban.solver import solve
from ragen.env.text_utils import (
    GRID_MOVES,
    finished_step,
    legend_text,
    match_choice,
    require_active,
    require_reset,
    step_info,
)

STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
SOLVED_REWARD = 10.0


@register("sokoban")
class SokobanEnv:
    """Procedurally generated Sokoban rooms (``dim_room`` = (height, width) including the border)."""

    DEFAULT_MAX_TURN = 5  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 5

    def __init__(
        self,
        dim_room: Sequence[int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 30,
        max_steps: int = 100,
    ) -> None:
        dims = tuple(int(x) for x in dim_room)
        if len(dims) != 2 or min(dims) < 4:
            raise ValueError(f"sokoban dim_room must be (height, width) with both >= 4, got {dim_room!r}")
        if int(num_boxes) < 1:
            raise ValueError(f"sokoban num_boxes must be >= 1, got {num_boxes}")
        if int(search_depth) < 1 or int(max_steps) < 1:
            raise ValueError(f"sokoban search_depth and max_steps must be >= 1, got {search_depth}, {max_steps}")
        self.dim_room, self.num_boxes = dims, int(num_boxes)
        self.search_depth, self.max_steps = int(search_depth), int(max_steps)
        self.instructions = (
            "You are a Sokoban player. Push every box onto a target. You can push a box by walking into it "
            "when the cell behind it is empty, but you cannot pull boxes or push two at once. "
            f"Grid legend: {legend_text(LEGEND)}. Row 1 is the top row. "
            f"Valid actions: {', '.join(GRID_MOVES)}."
        )
        self.room: Room | None = None
        self._steps = 0
        self._done = False

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.room = generate_room(rng, self.dim_room, self.num_boxes, self.search_depth)
        self._steps = 0
        self._done = False
        return self.room.render()

    def legal_actions(self) -> str:
        return ", ".join(self.action_list())

    def action_list(self) -> list[str]:
        """The four pushes / moves (a blocked one leaves the room as it is)."""
        return list(GRID_MOVES)

    def expert_action(self) -> str:
        """The expert's move in the current room (module docstring); reads the state only."""
        require_active(self.room is not None, self._done, "sokoban")
        plan = solve(self.room)
        if plan:
            return plan[0]
        outcomes = [(self.room.push(d)[1], d) for d in GRID_MOVES]
        walks = [d for outcome, d in outcomes if outcome.moved and not outcome.pushed]
        moves = [d for outcome, d in outcomes if outcome.moved]
        return (walks or moves or list(GRID_MOVES))[0]

    def step(self, action: str) -> StepResult:
        require_reset(self.room is not None, "sokoban")
        if self._done:
            return finished_step(self.room.render(), self.room.solved)
        direction = match_choice(action, GRID_MOVES)
        if direction is None:
            return StepResult(self.room.render(), 0.0, False, step_info(False, False, False))
        self.room, outcome = self.room.push(direction)
        self._steps += 1
        solved = self.room.solved
        reward = STEP_REWARD + BOX_ON_TARGET_REWARD * outcome.on_target_delta + (SOLVED_REWARD if solved else 0.0)
        self._done = solved or self._steps >= self.max_steps
        info = step_info(True, outcome.moved, solved, boxes_on_target=self.room.boxes_on_target)
        return StepResult(self.room.render(), reward, self._done, info)
