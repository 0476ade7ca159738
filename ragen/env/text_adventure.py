"""Text adventures: Z-machine games (``.z3``/``.z5``/``.z8``, e.g. the detective game) played through ``jericho``.

The user supplies the game file (``game_path``; nothing is downloaded). Each step sends one command (the
content of the model's answer tag) to the game. The observation is the game's response, then the current
location description, the inventory, the score and the valid actions::

    <game response>

    Location: <what "look" prints>
    Inventory: <what "inventory" prints>
    Score: 3 / 350
    Valid actions: north, take lamp, open mailbox, ...

"look" and "inventory" are run on a saved state that is restored afterwards, so they do not use a move.
Valid actions come from jericho's ``get_valid_actions`` (only for games jericho fully supports; others, e.g.
TextWorld games, show a hint instead). Reward = score change of the step; ``success`` = the game is won
(``victory()``); the episode ends when the game is won or lost, or after ``max_steps`` commands. An action is
effective when it changed the world state (jericho's world-state hash) or the score. Blank commands and
commands longer than jericho's 198-byte input buffer are invalid: reward 0, nothing sent to the game.

Only this small jericho interface is used (``GameLike``), so other backends or test doubles can be passed
through ``game_factory(game_path, seed) -> GameLike``.

No expert (no ``expert_action``, so ``has_expert("text_adventure")`` is False): the game file is the user's, and
the only general source of good play, a game's walkthrough, is a fixed command list from the opening position. It
cannot say what to do from a state reached by other commands (a warm start with noise needs that), and solving an
arbitrary Z-machine game from any state is a planning problem well beyond a scripted policy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ragen.env.base import StepResult, register

MAX_ACTION_BYTES = 198  # jericho's INPUT_BUFFER_SIZE
NO_VALID_ACTIONS = "(not available for this game; type any command, e.g. look, north, take <thing>, open <thing>)"


class GameLike(Protocol):
    """The part of ``jericho.FrotzEnv`` this env uses."""

    def seed(self, seed: int | None = None) -> Any: ...

    def reset(self) -> tuple[str, dict]: ...

    def step(self, action: str) -> tuple[str, float, bool, dict]: ...

    def get_valid_actions(self) -> list[str]: ...

    def get_score(self) -> int: ...

    def get_max_score(self) -> int: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...

    def get_world_state_hash(self) -> str: ...

    def victory(self) -> bool: ...

    def game_over(self) -> bool: ...


def jericho_game(game_path: str, seed: int) -> GameLike:
    """Open ``game_path`` with ``jericho.FrotzEnv`` (clear errors when jericho or the file is missing)."""
    try:
        import jericho
    except ImportError as exc:
        raise ImportError(
            "text_adventure needs jericho: install extra text_adventure, pip install 'ragen[text_adventure]' (jericho "
            "builds a small C library; needs gcc and make)"
        ) from exc
    with warnings.catch_warnings():  # "not fully supported" games still play; we show a hint instead
        warnings.simplefilter("ignore")
        return jericho.FrotzEnv(game_path, seed=seed)


def emulator_seed(seed: int) -> int:
    """Episode seed -> a positive frotz seed (jericho treats 0/None as "walkthrough seed or time-based")."""
    return seed % (2**31 - 2) + 1


INSTRUCTIONS = (
    "You are playing a text adventure game. Each turn, give one command for the game, such as 'north', "
    "'take lamp', 'open door' or 'examine desk'; prefer the listed valid actions. Your reward is the increase "
    "of the game's score. Put only the command in the answer tag."
)


@register("text_adventure")
class TextAdventureEnv:
    """Jericho text adventure (see the module docstring); config keys are the constructor's keyword arguments."""

    DEFAULT_MAX_TURN = 50  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    EXTRAS = {"jericho": "text_adventure"}  # ragen.env.missing_extras: checked by config validation

    def __init__(
        self,
        game_path: str | None = None,
        max_steps: int = 100,
        max_valid_actions: int = 50,
        game_factory: Callable[[str, int], GameLike] | None = None,
    ) -> None:
        if not game_path:
            raise ValueError(
                "text_adventure needs game_path=<a Z-machine game file (.z3/.z5/.z8)>, e.g. env.config.game_path="
                "/path/to/detective.z5; the games are not shipped with ragen"
            )
        if game_factory is None and not Path(game_path).is_file():
            raise FileNotFoundError(f"text_adventure game file {game_path!r} does not exist; check game_path")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.game_path = game_path
        self.game_factory = game_factory or jericho_game
        self.max_steps = max_steps
        self.max_valid_actions = max_valid_actions
        self.instructions = INSTRUCTIONS
        self.game: GameLike | None = None
        self.steps = 0
        self.done = True
        self.valid_actions: list[str] = []

    # ------------------------------------------------------------------ helpers
    def _peek(self, command: str) -> str:
        """The game's response to ``command`` without changing the game (state saved and restored)."""
        assert self.game is not None
        state = self.game.get_state()
        try:
            text = self.game.step(command)[0]
        finally:
            self.game.set_state(state)
        return text.strip()

    def _render(self, response: str) -> str:
        assert self.game is not None
        with warnings.catch_warnings():  # jericho warns on every call for games it does not fully support
            warnings.simplefilter("ignore")
            self.valid_actions = list(self.game.get_valid_actions())[: self.max_valid_actions]
        valid = ", ".join(self.valid_actions) if self.valid_actions else NO_VALID_ACTIONS
        max_score = self.game.get_max_score()
        score = f"{self.game.get_score()} / {max_score}" if max_score else str(self.game.get_score())
        return (f"{response.strip()}\n\nLocation: {self._peek('look')}\nInventory: {self._peek('inventory')}\n"
                f"Score: {score}\nValid actions: {valid}")

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int) -> str:
        if self.game is None:
            self.game = self.game_factory(self.game_path, emulator_seed(seed))
        self.game.seed(emulator_seed(seed))
        response, _ = self.game.reset()
        self.steps = 0
        self.done = False
        return self._render(response)

    def legal_actions(self) -> str:
        if self.done:
            return "The game is over."
        return ", ".join(self.valid_actions) if self.valid_actions else NO_VALID_ACTIONS

    def action_list(self) -> list[str]:
        """jericho's valid actions (empty where the game gives none, or once it is over)."""
        return [] if self.done else list(self.valid_actions)

    def step(self, action: str) -> StepResult:
        if self.done or self.game is None:
            return StepResult("The game is over.", 0.0, True, {"action_is_valid": False, "success": False})
        command = " ".join(action.split()) if isinstance(action, str) else ""
        if not command or len(command.encode("utf-8")) > MAX_ACTION_BYTES or not command.isprintable():
            info = {"action_is_valid": False, "action_is_effective": False, "success": False}
            return StepResult("Please give one short game command.", 0.0, False, info)
        score_before, hash_before = self.game.get_score(), self.game.get_world_state_hash()
        response, _, game_done, _ = self.game.step(command)
        self.steps += 1
        reward = float(self.game.get_score() - score_before)
        won = bool(self.game.victory())
        self.done = bool(game_done) or won or bool(self.game.game_over()) or self.steps >= self.max_steps
        changed = reward != 0 or self.game.get_world_state_hash() != hash_before
        obs = response.strip() if self.done else self._render(response)
        info = {"action_is_valid": True, "action_is_effective": changed, "success": won,
                "score": self.game.get_score(), "steps": self.steps}
        return StepResult(obs, reward, self.done, info)
