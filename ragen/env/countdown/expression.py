"""A safe arithmetic parser for Countdown answers: tokenizer + recursive descent, exact fractions, no eval.

Grammar (integers only, no unary operators, no exponent)::

    answer := expr [ "=" INT ]          # a trailing "= result" is allowed and ignored
    expr   := term { ("+" | "-") term }
    term   := factor { ("*" | "/") factor }
    factor := INT | "(" expr ")"

``x`` / ``×`` / ``÷`` / ``−`` are read as ``*`` / ``*`` / ``/`` / ``-``. Anything else (names, attribute access, ``**``,
``^``, unary minus, floats, more than ``MAX_CHARS`` characters, literals longer than ``MAX_DIGITS`` digits,
nesting deeper than ``MAX_DEPTH``) makes the answer malformed. Division by zero is well-formed but has no
value (``value=None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

MAX_CHARS = 300
MAX_DIGITS = 9
MAX_DEPTH = 32
_ALIASES = {"x": "*", "X": "*", "×": "*", "÷": "/", "−": "-"}
_OPERATORS = set("+-*/()=")


class MalformedExpression(ValueError):
    """The text is not an arithmetic expression of the accepted grammar."""


@dataclass(frozen=True)
class ParsedExpression:
    """A well-formed answer: its exact ``value`` (None after a division by zero) and the integer literals
    it uses, in order of appearance."""

    value: Fraction | None
    numbers: tuple[int, ...]


def tokenize(text: str) -> list[str]:
    """Split ``text`` into integer literals and operator characters; raise ``MalformedExpression`` on
    anything else."""
    if len(text) > MAX_CHARS:
        raise MalformedExpression(f"expression longer than {MAX_CHARS} characters")
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = _ALIASES.get(text[i], text[i])
        if ch.isspace():
            i += 1
        elif ch in "0123456789":
            j = i
            while j < len(text) and text[j] in "0123456789":
                j += 1
            if j - i > MAX_DIGITS:
                raise MalformedExpression(f"number longer than {MAX_DIGITS} digits")
            tokens.append(text[i:j])
            i = j
        elif ch in _OPERATORS:
            tokens.append(ch)
            i += 1
        else:
            raise MalformedExpression(f"unexpected character {text[i]!r}")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos, self.depth = tokens, 0, 0
        self.numbers: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise MalformedExpression("unexpected end of expression")
        self.pos += 1
        return token

    # Values are Fraction, or None once a division by zero made them undefined (None propagates).
    def expr(self) -> Fraction | None:
        value = self.term()
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term()
            if value is not None and rhs is not None:
                value = value + rhs if op == "+" else value - rhs
            else:
                value = None
        return value

    def term(self) -> Fraction | None:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.factor()
            if value is None or rhs is None or (op == "/" and rhs == 0):
                value = None
            else:
                value = value * rhs if op == "*" else value / rhs
        return value

    def factor(self) -> Fraction | None:
        token = self.take()
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        if token != "(":
            raise MalformedExpression(f"expected a number or '(' but found {token!r}")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise MalformedExpression(f"parentheses nested deeper than {MAX_DEPTH}")
        value = self.expr()
        if self.take() != ")":
            raise MalformedExpression("missing ')'")
        self.depth -= 1
        return value


def parse_expression(text: str) -> ParsedExpression:
    """Parse and evaluate ``text`` exactly; raise ``MalformedExpression`` if it is not well-formed."""
    tokens = tokenize(text)
    if "=" in tokens:
        cut = tokens.index("=")
        rest = tokens[cut + 1 :]
        if len(rest) != 1 or not rest[0].isdigit():
            raise MalformedExpression("after '=' only a single integer result may follow")
        tokens = tokens[:cut]
    if not tokens:
        raise MalformedExpression("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise MalformedExpression(f"unexpected {tokens[parser.pos]!r} after a complete expression")
    return ParsedExpression(value, tuple(parser.numbers))
