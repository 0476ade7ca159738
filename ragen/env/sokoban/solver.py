"""Breadth-first Sokoban solver: the shortest move sequence (in player moves) that solves a ``Room``.

Used by the env's expert (``SokobanEnv.expert_action``: the first move of ``solve`` from the current room) and by
the tests to check that every generated room is solvable and that the env's step rule agrees with a known
solution. Rooms here are small (a few dozen floor cells, 1-3 boxes), so plain BFS over
(player, boxes) states is fast; ``max_states`` bounds the search for anything larger.
"""

from __future__ import annotations

from collections import deque

from ragen.env.sokoban.room import Room
from ragen.env.text_utils import GRID_MOVES


def solve(room: Room, max_states: int = 200_000) -> list[str] | None:
    """Shortest list of moves (``"Up"``...) that puts every box on a target; ``[]`` if already solved;
    None when unsolvable or when more than ``max_states`` states would have to be explored."""
    if room.solved:
        return []
    start = (room.player, room.boxes)
    parents: dict[tuple, tuple[tuple, str] | None] = {start: None}
    queue: deque[Room] = deque([room])
    while queue:
        current = queue.popleft()
        key = (current.player, current.boxes)
        for direction in GRID_MOVES:
            nxt, outcome = current.push(direction)
            if not outcome.moved:
                continue
            nkey = (nxt.player, nxt.boxes)
            if nkey in parents:
                continue
            parents[nkey] = (key, direction)
            if nxt.solved:
                return _path(parents, nkey)
            if len(parents) > max_states:
                return None
            queue.append(nxt)
    return None


def _path(parents: dict[tuple, tuple[tuple, str] | None], key: tuple) -> list[str]:
    moves: list[str] = []
    link = parents[key]
    while link is not None:
        key, direction = link
        moves.append(direction)
        link = parents[key]
    return moves[::-1]
