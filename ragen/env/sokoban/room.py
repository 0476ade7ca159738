"""The Sokoban state and its move rule, shared by the env, the generator and the solver.

A ``Room`` is immutable: ``walls`` (every cell that is not floor, the border included), ``targets``,
``boxes`` and ``player`` are (row, col) cells, row 0 at the top. ``push(direction)`` applies the usual
rule: the player steps onto a free floor cell, or pushes one box if the cell behind it is free floor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ragen.env.text_utils import GRID_MOVES, render_grid

Cell = tuple[int, int]

LEGEND: dict[str, str] = {
    "#": "wall",
    "_": "empty floor",
    "O": "target",
    "X": "box",
    "√": "box on a target",
    "P": "player",
    "S": "player on a target",
}


@dataclass(frozen=True)
class MoveOutcome:
    """What one move did: ``moved`` (player changed cell), ``pushed`` (a box moved), ``on_target_delta``
    (+1 a box was pushed onto a target, -1 off a target, 0 otherwise)."""

    moved: bool
    pushed: bool
    on_target_delta: int


@dataclass(frozen=True)
class Room:
    """One Sokoban state on a ``height`` x ``width`` grid (see the module docstring)."""

    height: int
    width: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    def is_free(self, cell: Cell) -> bool:
        """Floor with no box on it (cells outside the grid count as walls)."""
        row, col = cell
        inside = 0 <= row < self.height and 0 <= col < self.width
        return inside and cell not in self.walls and cell not in self.boxes

    @property
    def solved(self) -> bool:
        return self.boxes <= self.targets

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    def push(self, direction: str) -> tuple[Room, MoveOutcome]:
        """Apply move ``direction`` (a key of ``GRID_MOVES``); a blocked move returns the same room."""
        d_row, d_col = GRID_MOVES[direction]
        nxt = (self.player[0] + d_row, self.player[1] + d_col)
        if self.is_free(nxt):
            return replace(self, player=nxt), MoveOutcome(True, False, 0)
        if nxt not in self.boxes:
            return self, MoveOutcome(False, False, 0)
        beyond = (nxt[0] + d_row, nxt[1] + d_col)
        if not self.is_free(beyond):
            return self, MoveOutcome(False, False, 0)
        delta = int(beyond in self.targets) - int(nxt in self.targets)
        boxes = (self.boxes - {nxt}) | {beyond}
        return replace(self, boxes=boxes, player=nxt), MoveOutcome(True, True, delta)

    def render(self) -> str:
        """Text grid with the symbols of ``LEGEND``."""
        rows = []
        for row in range(self.height):
            line = []
            for col in range(self.width):
                cell = (row, col)
                if cell in self.walls:
                    line.append("#")
                elif cell == self.player:
                    line.append("S" if cell in self.targets else "P")
                elif cell in self.boxes:
                    line.append("√" if cell in self.targets else "X")
                else:
                    line.append("O" if cell in self.targets else "_")
            rows.append(line)
        return render_grid(rows)


def parse_room(text: str) -> Room:
    """Inverse of ``Room.render``: build a room from a grid drawn with the ``LEGEND`` symbols (for tests and
    hand-made levels). Raises ``ValueError`` on unknown symbols, ragged rows or not exactly one player."""
    lines = text.strip("\n").split("\n")
    width = len(lines[0]) if lines else 0
    if not lines or any(len(line) != width for line in lines):
        raise ValueError(f"a sokoban grid needs equal-length rows, got {lines!r}")
    walls, targets, boxes, players = set(), set(), set(), []
    for row, line in enumerate(lines):
        for col, symbol in enumerate(line):
            cell = (row, col)
            if symbol not in LEGEND:
                raise ValueError(f"unknown sokoban symbol {symbol!r} at {cell}; symbols: {''.join(LEGEND)}")
            if symbol == "#":
                walls.add(cell)
            if symbol in "O√S":
                targets.add(cell)
            if symbol in "X√":
                boxes.add(cell)
            if symbol in "PS":
                players.append(cell)
    if len(players) != 1:
        raise ValueError(f"a sokoban grid needs exactly one player (P or S), found {len(players)}")
    return Room(len(lines), width, frozenset(walls), frozenset(targets), frozenset(boxes), players[0])
