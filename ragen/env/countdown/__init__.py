"""Countdown: seeded puzzle generator (solvable by construction), safe expression parser and the text env."""

from ragen.env.countdown.env import CountdownEnv
from ragen.env.countdown.expression import MalformedExpression, ParsedExpression, parse_expression, tokenize
from ragen.env.countdown.generator import Puzzle, generate_puzzle

__all__ = [
    "CountdownEnv",
    "MalformedExpression",
    "ParsedExpression",
    "Puzzle",
    "generate_puzzle",
    "parse_expression",
    "tokenize",
]
