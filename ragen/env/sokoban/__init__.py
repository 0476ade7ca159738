"""Sokoban: seeded room generator (reverse play, solvable by construction), BFS solver and the text env."""

from ragen.env.sokoban.env import SokobanEnv
from ragen.env.sokoban.generator import generate_room
from ragen.env.sokoban.room import LEGEND, MoveOutcome, Room, parse_room
from ragen.env.sokoban.solver import solve

__all__ = ["LEGEND", "MoveOutcome", "Room", "SokobanEnv", "generate_room", "parse_room", "solve"]
