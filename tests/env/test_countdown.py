import builtins
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.countdown import MalformedExpression, Puzzle, generate_puzzle, parse_expression


def _reachable(values, target):
    """Independent brute force: can ``values`` (Fractions), each used exactly once, reach ``target``?"""
    if len(values) == 1:
        return values[0] == target
    for i in range(len(values)):
        for j in range(len(values)):
            if i == j:
                continue
            a, b = values[i], values[j]
            rest = [v for k, v in enumerate(values) if k not in (i, j)]
            results = [a + b, a - b, a * b] + ([a / b] if b != 0 else [])
            if any(_reachable(rest + [r], target) for r in results):
                return True
    return False


def _env_with(numbers, target):
    env = E.make("countdown", num_numbers=len(numbers))
    env.reset(0)
    env.puzzle = Puzzle(tuple(numbers), target, "")
    return env


def test_brute_force_reference_can_say_no():
    assert _reachable([Fraction(2), Fraction(3), Fraction(4)], 14)
    assert _reachable([Fraction(1), Fraction(5), Fraction(5), Fraction(5)], 24)  # (5 - 1/5) * 5
    assert not _reachable([Fraction(1), Fraction(1), Fraction(1)], 100)
    assert not _reachable([Fraction(2), Fraction(3), Fraction(4)], 25)


@pytest.mark.parametrize("num_numbers", [3, 4])
def test_generated_targets_are_reachable(num_numbers):
    env = E.make("countdown", num_numbers=num_numbers)
    for seed in range(120 if num_numbers == 4 else 300):
        obs = env.reset(seed)
        puzzle = env.puzzle
        assert obs == f"Numbers: {', '.join(map(str, puzzle.numbers))}\nTarget: {puzzle.target}"
        assert len(puzzle.numbers) == num_numbers and all(1 <= n <= 50 for n in puzzle.numbers)
        assert 1 <= puzzle.target <= 1000
        assert _reachable([Fraction(n) for n in puzzle.numbers], puzzle.target), f"seed {seed}"
        parsed = parse_expression(puzzle.solution)
        assert parsed.value == puzzle.target and sorted(parsed.numbers) == sorted(puzzle.numbers)
        result = env.step(puzzle.solution)
        assert (result.reward, result.done, result.info["success"]) == (1.0, True, True)


def test_determinism_and_variety():
    env = E.make("countdown")
    first = [env.reset(seed) for seed in range(30)]
    assert first == [env.reset(seed) for seed in range(30)]
    assert len(set(first)) == 30
    assert generate_puzzle(random.Random(5)) == generate_puzzle(random.Random(5))


@pytest.mark.parametrize(
    ("answer", "reward", "outcome"),
    [
        ("2 + 3 * 4", 1.0, "correct"),  # precedence: 2 + 12
        ("3*4+2 = 14", 1.0, "correct"),  # trailing "= result" is ignored
        ("(2 + 3) * 4", 0.1, "wrong"),  # 20
        ("2 * 3 + 4", 0.1, "wrong"),  # 10
        ("12 + 2", 0.1, "wrong"),  # right value, wrong numbers
        ("2 + 3 * 4 + 4 - 4", 0.1, "wrong"),  # 4 used three times
        ("3 * 4", 0.1, "wrong"),  # 2 not used
        ("2 + 3 * 4 = 15", 1.0, "correct"),  # the claimed result is ignored; the left side is graded
        ("hello", 0.0, "malformed"),
        ("", 0.0, "malformed"),
        ("-2 + 16", 0.0, "malformed"),  # no unary minus
    ],
)
def test_hand_checked_rewards(answer, reward, outcome):
    env = _env_with((2, 3, 4), 14)
    result = env.step(answer)
    assert (result.reward, result.done, result.info["outcome"]) == (reward, True, outcome)
    assert result.info["action_is_valid"] is (outcome != "malformed")
    assert result.info["success"] is (outcome == "correct")
    again = env.step(answer)
    assert (again.reward, again.done, again.info["action_is_valid"]) == (0.0, True, False)


def test_exact_fractions_not_floats():
    env = _env_with((1, 49, 49), 1)
    assert 1 / 49 * 49 != 1  # floats would reject the right answer
    assert env.step("1 / 49 * 49").reward == 1.0


def test_division_by_zero_is_wrong_not_a_crash():
    assert parse_expression("1/0").value is None
    assert parse_expression("(5 / (3 - 3)) + 1").numbers == (5, 3, 3, 1)
    env = _env_with((3, 3, 5), 5)
    result = env.step("5 / (3 - 3)")
    assert (result.reward, result.info["outcome"]) == (0.1, "wrong")
    assert "division by zero" in result.observation


@pytest.mark.parametrize(
    ("text", "value"),
    [("8-3-2", 3), ("16/4/2", 2), ("2*(3+4)", 14), ("2x3", 6), ("6÷2", 3), ("((7))", 7), (" 1 +\n2 ", 3)],
)
def test_parser_arithmetic(text, value):
    assert parse_expression(text).value == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "__import__('os').system('ls')",
        "().__class__.__bases__",
        "(1).real",
        "abs(3)",
        "os",
        "2**3**4",
        "9^9^9",
        "1e9",
        "1.5 + 2",
        "1234567890 * 2",  # literal longer than 9 digits
        "(" * 40 + "1" + ")" * 40,  # nesting too deep
        "1+" * 200 + "1",  # too long
        "1 + (2",
        "1 2",
        "= 3",
        "3 = 3 + 1",
        "+",
        "()",
    ],
)
def test_safe_parser_rejects_code_and_junk(text, monkeypatch):
    def no_eval(*args, **kwargs):
        raise AssertionError("eval/exec must never be used")

    monkeypatch.setattr(builtins, "eval", no_eval)
    monkeypatch.setattr(builtins, "exec", no_eval)
    with pytest.raises(MalformedExpression):
        parse_expression(text)
    env = _env_with((2, 3, 4), 14)
    result = env.step(text)
    assert (result.reward, result.info["outcome"], result.info["action_is_valid"]) == (0.0, "malformed", False)


def _expressions():
    """(text, value) pairs built recursively with a known exact value (None after a division by zero)."""
    leaf = st.integers(0, 999).map(lambda n: (str(n), Fraction(n)))

    def combine(children):
        def apply(a, op, b):
            (ta, va), (tb, vb) = a, b
            if va is None or vb is None or (op == "/" and vb == 0):
                value = None
            else:
                value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
            return f"({ta} {op} {tb})", value

        return st.builds(apply, children, st.sampled_from("+-*/"), children)

    return st.recursive(leaf, combine, max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_expressions())
def test_parser_matches_reference_values(pair):
    text, value = pair
    assert parse_expression(text).value == value


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/()= x", max_size=60) | st.text(max_size=80))
def test_random_text_is_graded_never_raises(text):
    env = _env_with((2, 3, 4), 14)
    result = env.step(text)
    assert result.done
    assert result.reward in (0.0, 0.1, 1.0)
    assert result.info["outcome"] in ("malformed", "wrong", "correct")
