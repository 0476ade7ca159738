"""FrozenLake as a text environment, built on gymnasium's ``FrozenLakeEnv``.

Each ``reset(seed)`` draws a new map with ``generate_random_map(size, p, seed)`` (gymnasium guarantees a
frozen path from start to goal) and seeds gymnasium's own RNG with the same seed, so the map and, when
``is_slippery``, the slips are deterministic per seed.

Grid legend: ``P`` player, ``_`` frozen ice (the start cell included), ``O`` hole, ``G`` goal,
``X`` player fallen into a hole, ``√`` player on the goal. Actions: ``Left``, ``Down``, ``Right``, ``Up``.
Reward 1 on reaching the goal, else 0; the episode ends on the goal, in a hole or after ``max_steps``
valid actions. ``action_is_effective`` means the player's cell changed (a slip counts if it moved).
Invalid actions: reward 0, state (and step count) unchanged, episode goes on.

Expert (``expert_action``): on plain ice the first move of a shortest path to the goal (``shortest_path``, BFS over
the current map from the current cell); on slippery ice the move that maximises the probability of reaching the
goal within the remaining steps (value iteration over gymnasium's transition table). When the goal cannot be
reached, a legal move that does not walk into a hole if there is one.
"""

from __future__ import annotations

import functools
from collections import deque

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as _GymFrozenLake
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from ragen.env.base import StepResult, register
from ragen.env.text_utils import (
    GRID_MOVES,
    finished_step,
    legend_text,
    match_choice,
    render_grid,
    require_active,
    require_reset,
    step_info,
)

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


def shortest_path(desc: list[str], start: tuple[int, int], goal_tile: str = "G") -> list[str] | None:
    """Action names of a shortest walk on map ``desc`` from ``start`` (row, col) to the nearest tile of type
    ``goal_tile`` (``"G"``; ``"H"`` finds the nearest hole), without stepping on any other hole or goal (the
    episode would end there); ``[]`` when ``start`` is such a tile, None when none is reachable. Deterministic:
    moves are tried in the order of ``ACTIONS``."""
    size = len(desc)
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == goal_tile:
            path = []
            while parents[cell] is not None:
                cell, action = parents[cell]
                path.append(action)
            return path[::-1]
        if desc[cell[0]][cell[1]] in "HG":
            continue  # the episode would end here
        for action in ACTIONS:
            d_row, d_col = GRID_MOVES[action]
            nxt = (cell[0] + d_row, cell[1] + d_col)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < len(desc[0]) and nxt not in parents:
                parents[nxt] = (cell, action)
                queue.append(nxt)
    return None


@functools.lru_cache(maxsize=256)
def _slippery_values(desc: tuple[str, ...], horizon: int) -> list[list[float]]:
    """``values[k][s]``: the highest probability of reaching the goal from state ``s`` within ``k`` moves on slippery
    ice (gymnasium's transition table for map ``desc``), for ``k`` = 0.. until the values stop changing (later
    horizons equal the last entry) or ``horizon``."""
    table = _GymFrozenLake(desc=list(desc), is_slippery=True).P
    values = [[0.0] * (len(desc) * len(desc[0]))]
    for _ in range(horizon):
        last = values[-1]
        new = [max(sum(p * (float(r) if term else last[nxt]) for p, nxt, r, term in table[s][a])
                   for a in range(len(ACTIONS))) for s in range(len(last))]
        if max(abs(a - b) for a, b in zip(new, last, strict=True)) < 1e-12:
            break
        values.append(new)
    return values


@register("frozen_lake")
class FrozenLakeEnv:
    """Text FrozenLake on a random ``size`` x ``size`` map (``p`` = probability a tile is frozen)."""

    DEFAULT_MAX_TURN = 5  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 5

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
        return ", ".join(self.action_list())

    def action_list(self) -> list[str]:
        """The four moves (any move is legal; one into a wall leaves the player where it is)."""
        return list(ACTIONS)

    def render(self) -> str:
        """The text grid of the current state (legend in the module docstring)."""
        row, col = self.position
        rows = [[_TILE_SYMBOL[ch] for ch in line] for line in self._desc]
        rows[row][col] = _PLAYER_SYMBOL[self._desc[row][col]]
        return render_grid(rows)

    def expert_action(self) -> str:
        """The expert's move from the current cell (module docstring); reads the state only."""
        require_active(self._gym is not None, self._done, "frozen_lake")
        path = shortest_path(self._desc, self.position, "G")
        if self.is_slippery:
            return self._best_slippery_move(path[0] if path else None)
        if path:
            return path[0]
        return self._safe_move()

    def _safe_move(self) -> str:
        """A legal move that does not enter a hole, preferring one that changes cell (any move if none is safe)."""
        row, col = self.position
        safe = []
        for index, action in enumerate(ACTIONS):
            d_row, d_col = GRID_MOVES[action]
            nxt = (min(max(row + d_row, 0), self.size - 1), min(max(col + d_col, 0), self.size - 1))
            if self._desc[nxt[0]][nxt[1]] != "H":
                safe.append((nxt == (row, col), index))
        return ACTIONS[min(safe)[1]] if safe else ACTIONS[0]

    def _best_slippery_move(self, preferred: str | None) -> str:
        """The move with the highest probability of reaching the goal within the remaining steps (finite-horizon
        value iteration, ``_slippery_values``); ties: ``preferred``, then the order of ``ACTIONS``."""
        table = self._gym.P
        values = _slippery_values(tuple(self._desc), self.max_steps)
        remaining = self.max_steps - self._steps
        after = values[min(remaining - 1, len(values) - 1)]  # success probability with one step fewer
        state = int(self._gym.s)
        scores = [sum(p * (float(r) if term else after[nxt]) for p, nxt, r, term in table[state][a])
                  for a in range(len(ACTIONS))]
        best = max(scores)
        if best <= 0.0:
            return preferred or self._safe_move()
        if preferred is not None and scores[ACTIONS.index(preferred)] >= best - 1e-12:
            return preferred
        return ACTIONS[scores.index(best)]

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
