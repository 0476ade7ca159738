"""Seeded Countdown puzzles whose target is reachable by construction.

Draw ``num_numbers`` integers in ``[min_number, max_number]``, then fold them into one value: repeatedly
take two random items from the pool, combine them with a random operator whose result is a positive
integer (``+`` always; ``-`` when the first is larger; ``*``; ``/`` when it divides exactly) and put the
result back, until one item is left. That item is the target and its expression is a reference solution
that uses every number exactly once. Draws whose target exceeds ``max_target`` are redrawn from the same
RNG, so the puzzle is deterministic per seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Puzzle:
    """``numbers`` (in display order), the ``target`` and one ``solution`` expression reaching it."""

    numbers: tuple[int, ...]
    target: int
    solution: str


def generate_puzzle(
    rng: random.Random,
    num_numbers: int = 4,
    min_number: int = 1,
    max_number: int = 50,
    max_target: int = 1000,
    max_attempts: int = 1000,
) -> Puzzle:
    """One puzzle drawn from ``rng`` (see the module docstring)."""
    for _ in range(max_attempts):
        numbers = tuple(rng.randint(min_number, max_number) for _ in range(num_numbers))
        pool: list[tuple[int, str]] = [(n, str(n)) for n in numbers]
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            (a, a_text), (b, b_text) = pool[i], pool[j]
            pool = [item for k, item in enumerate(pool) if k not in (i, j)]
            pool.append(_combine(rng, a, a_text, b, b_text))
        target, solution = pool[0]
        if num_numbers > 1:
            solution = solution[1:-1]  # drop the outermost parentheses
        if target <= max_target:
            return Puzzle(numbers, target, solution)
    raise ValueError(
        f"no countdown target <= max_target={max_target} in {max_attempts} draws of {num_numbers} numbers "
        f"in [{min_number}, {max_number}]; raise max_target or lower max_number"
    )


def _combine(rng: random.Random, a: int, a_text: str, b: int, b_text: str) -> tuple[int, str]:
    """Combine two positive integers with a random operator that keeps the result a positive integer."""
    if a < b:
        a, a_text, b, b_text = b, b_text, a, a_text
    ops = ["+", "*"]
    if a > b:
        ops.append("-")
    if a % b == 0 and b > 1:
        ops.append("/")
    op = rng.choice(ops)
    value = {"+": a + b, "*": a * b, "-": a - b, "/": a // b}[op]
    return value, f"({a_text} {op} {b_text})"
