"""FrozenLake as a text environment, built on gymnasium's ``FrozenLakeEnv``.

Each ``reset(seed)`` draws a new map with ``generate_random_map(size, p, seed)`` (gymnasium guarantees a
frozen path from start to goal) and seeds gymnasium's own RNG with the same seed, so the map and, when
``is_slippery``, the slips are deterministic per seed.

Grid legend: ``P`` player, ``_`` frozen ice (the start cell included), ``O`` hole, ``G`` goal,
``X`` player fallen into a hole, ``√`` player on the goal. Actions: ``Left``, ``Down``, ``Right``, ``Up``.
Reward 1 on reaching the goal, else 0; the episode ends on the goal, in a hole or after ``max_steps``
valid actions. ``action_is_effective`` means the player's cell changed (a slip counts if it moved).
Invalid actions: reward 0, state (and step count) unchanged, episode goes on.
"""

from __future__ import annotations

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as _GymFrozenLake
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from ragen.env.base import StepResult, register
from ragen.env.text_utils import finished_step, legend_text, match_choice, render_grid, require_reset, step_info

ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")  # index = gymnasium's action id
LEGEND: dict[str, str] = {
    "P": "player",
    "_": "frozen ice",
    "O": "hole",
    "G": "goal",
    "X": "player fallen into a hole",
    "√": "player on the goal",
}
_TILE_SYMBOL = {"S": "_", "F": "_", "H": "O", "G": "G"}
_PLAYER_SYMBOL = {"S": "P", "F": "P", "H": "X", "G": "√"}


@register("frozen_lake")
class FrozenLakeEnv:
    """Text FrozenLake on a random ``size`` x ``size`` map (``p`` = probability a tile is frozen)."""

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = False, max_steps: int = 100) -> None:
        if int(size) < 2:
            raise ValueError(f"frozen_lake size must be >= 2, got {size}")
        if not 0.0 < float(p) <= 1.0:
            raise ValueError(f"frozen_lake p (probability of a frozen tile) must be in (0, 1], got {p}")
        if int(max_steps) < 1:
            raise ValueError(f"frozen_lake max_steps must be >= 1, got {max_steps}")
        self.size, self.p, self.is_slippery, self.max_steps = int(size), float(p), bool(is_slippery), int(max_steps)
        slip = " The ice is slippery: you may slide sideways instead of where you meant to go." if is_slippery else ""
        self.instructions = (
            "You are on a frozen lake. Walk from your position to the goal G without falling into a hole O."
            f"{slip} Grid legend: {legend_text(LEGEND)}. Row 1 is the top row. "
            f"Valid actions: {', '.join(ACTIONS)}."
        )
        self._gym: _GymFrozenLake | None = None
        self._desc: list[str] = []
        self._steps = 0
        self._done = False
        self._success = False

    def reset(self, seed: int) -> str:
        seed = int(seed) % 2**32  # gymnasium/numpy only take non-negative seeds
        self._desc = generate_random_map(size=self.size, p=self.p, seed=seed)
        self._gym = _GymFrozenLake(desc=self._desc, is_slippery=self.is_slippery)
        self._gym.reset(seed=seed)
        self._steps = 0
        self._done = self._success = False
        return self.render()

    @property
    def position(self) -> tuple[int, int]:
        """The player's (row, col), row 0 at the top."""
        state = int(self._gym.s) if self._gym is not None else 0
        return divmod(state, self.size)

    @property
    def desc(self) -> list[str]:
        """The gymnasium map of the current episode (``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal)."""
        return list(self._desc)

    def legal_actions(self) -> str:
        return ", ".join(ACTIONS)

    def render(self) -> str:
        """The text grid of the current state (legend in the module docstring)."""
        row, col = self.position
        rows = [[_TILE_SYMBOL[ch] for ch in line] for line in self._desc]
        rows[row][col] = _PLAYER_SYMBOL[self._desc[row][col]]
        return render_grid(rows)

    def step(self, action: str) -> StepResult:
        require_reset(self._gym is not None, "frozen_lake")
        if self._done:
            return finished_step(self.render(), self._success)
        name = match_choice(action, ACTIONS)
        if name is None:
            return StepResult(self.render(), 0.0, False, step_info(False, False, False))
        before = self.position
        _, reward, terminated, _, _ = self._gym.step(ACTIONS.index(name))
        self._steps += 1
        row, col = self.position
        self._success = self._desc[row][col] == "G"
        self._done = bool(terminated) or self._steps >= self.max_steps
        info = step_info(True, self.position != before, self._success)
        return StepResult(self.render(), float(reward), self._done, info)
