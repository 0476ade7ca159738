"""Seeded procedural Sokoban rooms that are solvable by construction.

1. Topology: a random walk carves floor out of a solid ``dim_room`` block (the border stays wall) until
   about 80% of the interior is floor; the walk keeps the floor connected.
2. Goal state: ``num_boxes`` targets on random floor cells, every box on its target, the player on another
   floor cell.
3. Reverse play: ``search_depth`` random *reverse* moves from the goal state. A reverse move either steps
   the player onto a free neighbour, or steps away from an adjacent box while pulling it along. Each
   reverse move undoes a legal forward move (a pull is a push played backwards), so the goal is reachable
   from every state on the walk. Pulls are favoured (weight 3) so boxes travel.
4. The start state is the state on the walk whose boxes are farthest (sum of Manhattan distances) from
   their own targets, with at least one box off target; a walk that never moves a box is discarded and a
   new room is drawn from the same RNG, so generation stays deterministic per seed.
5. The player is then moved to a random cell it can walk to without touching a box (walking is
   reversible, so the room stays solvable); this keeps the player from always standing next to a box.
   Rooms that a single move solves are rejected as too trivial.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ragen.env.sokoban.room import Cell, Room
from ragen.env.text_utils import GRID_MOVES

FLOOR_FRACTION = 0.8  # share of the interior that the carving walk turns into floor
TURN_PROB = 0.35  # chance that the carving walk changes direction at each step
PULL_WEIGHT = 3.0  # relative weight of a pulling reverse move against a plain one


def generate_room(
    rng: random.Random,
    dim_room: Sequence[int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = 30,
    max_attempts: int = 200,
) -> Room:
    """Draw one solvable room from ``rng`` (see the module docstring); ``dim_room`` = (height, width)
    including the border walls."""
    height, width = (int(x) for x in dim_room)
    for _ in range(max_attempts):
        floor = _carve_floor(rng, height, width, num_boxes)
        if len(floor) < num_boxes + 2:
            continue
        room = _reverse_play(rng, height, width, floor, num_boxes, search_depth)
        if room is not None and not any(room.push(d)[0].solved for d in GRID_MOVES):
            return room
    raise ValueError(
        f"could not generate a sokoban room with num_boxes={num_boxes} in dim_room={tuple(dim_room)} "
        f"within {max_attempts} attempts; use a larger room, fewer boxes or a larger search_depth"
    )


def _carve_floor(rng: random.Random, height: int, width: int, num_boxes: int) -> frozenset[Cell]:
    interior = [(r, c) for r in range(1, height - 1) for c in range(1, width - 1)]
    want = min(len(interior), max(2 * num_boxes + 3, round(FLOOR_FRACTION * len(interior))))
    cell = rng.choice(interior)
    floor = {cell}
    direction = rng.choice(list(GRID_MOVES.values()))
    for _ in range(50 * len(interior)):
        if len(floor) >= want:
            break
        if rng.random() < TURN_PROB:
            direction = rng.choice(list(GRID_MOVES.values()))
        nxt = (cell[0] + direction[0], cell[1] + direction[1])
        if 1 <= nxt[0] < height - 1 and 1 <= nxt[1] < width - 1:
            cell = nxt
            floor.add(cell)
    return frozenset(floor)


def _reverse_play(
    rng: random.Random, height: int, width: int, floor: frozenset[Cell], num_boxes: int, search_depth: int
) -> Room | None:
    cells = sorted(floor)
    targets = rng.sample(cells, num_boxes)
    boxes = list(targets)  # boxes[i] started on targets[i]
    player = rng.choice([c for c in cells if c not in targets])
    best: tuple[int, list[Cell], Cell] | None = None
    for _ in range(search_depth):
        options: list[tuple[Cell, int | None]] = []  # (player destination, index of pulled box or None)
        for d_row, d_col in GRID_MOVES.values():
            dest = (player[0] + d_row, player[1] + d_col)
            if dest not in floor or dest in boxes:
                continue
            options.append((dest, None))
            behind = (player[0] - d_row, player[1] - d_col)
            if behind in boxes:
                options.append((dest, boxes.index(behind)))
        if not options:
            break
        weights = [1.0 if pulled is None else PULL_WEIGHT for _, pulled in options]
        dest, pulled = rng.choices(options, weights=weights)[0]
        if pulled is not None:
            boxes[pulled] = player
        player = dest
        score = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets, strict=True))
        if set(boxes) != set(targets) and (best is None or score >= best[0]):
            best = (score, list(boxes), player)
    if best is None:
        return None
    _, boxes, player = best
    player = rng.choice(sorted(_walkable_from(player, floor - set(boxes))))
    walls = frozenset((r, c) for r in range(height) for c in range(width)) - floor
    return Room(height, width, walls, frozenset(targets), frozenset(boxes), player)


def _walkable_from(start: Cell, free: frozenset[Cell]) -> set[Cell]:
    """Cells of ``free`` reachable from ``start`` by single steps (``start`` included)."""
    seen, stack = {start}, [start]
    while stack:
        row, col = stack.pop()
        for d_row, d_col in GRID_MOVES.values():
            nxt = (row + d_row, col + d_col)
            if nxt in free and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen
