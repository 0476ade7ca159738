"""Small helpers shared by the text environments: action matching, grid rendering, common step results.

Every env matches actions the same way (``normalize_action``): surrounding whitespace, quotes, backticks
and trailing sentence punctuation are dropped, inner whitespace is collapsed and case is ignored, so
``" up. "``, ``"UP"`` and ``"`Up`"`` all mean ``Up``. Anything else is an invalid action, never an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ragen.env.base import StepResult

# Row/column offsets of the four grid moves (row 0 is the top line of the rendered grid).
GRID_MOVES: dict[str, tuple[int, int]] = {
    "Up": (-1, 0),
    "Down": (1, 0),
    "Left": (0, -1),
    "Right": (0, 1),
}

_STRIP_CHARS = " \t\r\n\"'`*.,;:!"


def normalize_action(text: object) -> str:
    """Canonical lower-case form of an action string; non-strings become ``""`` (an invalid action)."""
    if not isinstance(text, str):
        return ""
    return " ".join(text.strip(_STRIP_CHARS).split()).lower()


def match_choice(text: object, choices: Iterable[str]) -> str | None:
    """Return the choice ``text`` names (case-insensitive, see ``normalize_action``), or None."""
    key = normalize_action(text)
    if not key:
        return None
    for choice in choices:
        if normalize_action(choice) == key:
            return choice
    return None


def render_grid(rows: Sequence[Sequence[str]]) -> str:
    """One line per row, one symbol per cell, no separators."""
    return "\n".join("".join(row) for row in rows)


def legend_text(legend: Mapping[str, str]) -> str:
    """``"# wall, _ empty, ..."``: the symbol legend written into an env's instructions."""
    return ", ".join(f"{symbol} {meaning}" for symbol, meaning in legend.items())


def step_info(valid: bool, effective: bool, success: bool, **extra: object) -> dict[str, object]:
    """The info dict every ``StepResult`` carries, plus env-specific extras."""
    return {"action_is_valid": bool(valid), "action_is_effective": bool(effective), "success": bool(success), **extra}


def finished_step(observation: str, success: bool) -> StepResult:
    """What ``step`` returns once the episode is over: done again, no reward, the action is not valid."""
    return StepResult(observation, 0.0, True, step_info(False, False, success))


def require_reset(started: bool, env_name: str) -> None:
    """Raise a clear error when ``step`` is called before the first ``reset`` (a caller bug, not bad text)."""
    if not started:
        raise RuntimeError(f"{env_name}: call reset(seed) before step(action)")


def require_active(started: bool, done: bool, env_name: str) -> None:
    """Raise a clear error when ``expert_action`` is asked outside an episode (before ``reset`` or after its end)."""
    if not started:
        raise RuntimeError(f"{env_name}: call reset(seed) before expert_action()")
    if done:
        raise RuntimeError(f"{env_name}: the episode is over; expert_action() needs an episode in progress "
                           "(call reset(seed) to start a new one)")
