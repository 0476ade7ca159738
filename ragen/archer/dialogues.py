"""Recorded dialogues as warm-start data (``archer.offline_dialogues``), beside the envs' scripted experts.

The ArCHer reference code (github.com/YifeiZhou02/ArCHer) starts every run from a policy behaviour-cloned on an
offline dataset of dialogues. :func:`load_dialogues` reads its two JSON formats (samples and the format in
``ragen/data/dialogues``):

* Twenty Questions: ``[{"lines": ["Is it an animal? Yes.", ...], "correct": bool, "word": [name, alias...]}]``;
* Guess My City: ``[{"conversation": ["Is your city in Europe? Yes, it is.", ...], "done": bool,
  "word": "paris,france"}]``.

Each line is one turn; as the reference's own BC script reads them, the question is the text up to and including
its first ``?`` and the answer is the rest. A Twenty Questions dialogue is won when ``correct``; a Guess My City one
when its last question names the city (the reference env's test: the city name occurs in the question).

:class:`DialogueReplayEnv` (registered as ``offline_dialogues``) replays one dialogue per episode in the texts of
the live env (``game``: its instructions, opening, legal-actions line and answer observations, from
``ragen.env.twenty_questions`` / ``ragen.env.guess_my_city``): its expert action is the recorded question and a
step answers with the recorded answer (Twenty Questions answers normalised to Yes / No / Invalid; a Guess My City
answer that names the city before the guess becomes "I can't answer that question.", as the reference env does).
Reward -1 per question, 0 on the winning one, as the live envs. So the warm start (``ragen.trainer.warm_start``)
plays the recorded dialogues through an agent proxy of their own (:func:`replay_proxy`) and imitates exactly the
tokens RL later samples, with the prompts RL sees. The replay answers the recorded question whatever was asked,
so it only serves imitation without noise (``sft.noise=0``; ``info["replayed"]`` says whether the step's action was
the recorded question).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ragen.env import guess_my_city, twenty_questions
from ragen.env.base import StepResult, register
from ragen.env.oracle import fold, normalize_yes_no, words
from ragen.env.text_utils import require_active

ENV_NAME = "offline_dialogues"
GAMES: dict[str, ModuleType] = {"twenty_questions": twenty_questions, "guess_my_city": guess_my_city}
CITY_CENSORED = "I can't answer that question."


@dataclass(frozen=True)
class Dialogue:
    """One recorded game: ``questions[k]`` was answered ``answers[k]``; ``word`` is the secret's display name;
    ``success``: the last question won the game."""

    questions: tuple[str, ...]
    answers: tuple[str, ...]
    word: str
    success: bool


def split_line(line: str) -> tuple[str, str]:
    """``"Is it red? No."`` -> ``("Is it red?", "No.")``: the question up to its first ``?``, the answer after it
    (a line without ``?`` is all question)."""
    question, mark, answer = line.partition("?")
    return (question + mark).strip(), answer.strip()


def _dialogue(rec: Any, where: str) -> Dialogue:
    if not isinstance(rec, dict) or not ({"lines", "conversation"} & set(rec)):
        raise ValueError(f"{where}: expected an object with 'lines' (Twenty Questions) or 'conversation' "
                         "(Guess My City)")
    lines = rec.get("lines", rec.get("conversation"))
    if not isinstance(lines, list) or not lines or not all(isinstance(x, str) for x in lines):
        raise ValueError(f"{where}: 'lines' / 'conversation' must be a non-empty list of strings")
    questions, answers = zip(*(split_line(x) for x in lines), strict=True)
    if "lines" in rec:  # Twenty Questions
        word = rec.get("word", "")
        name = str(word[0] if isinstance(word, list) and word else word)
        return Dialogue(tuple(questions), tuple(answers), name, bool(rec.get("correct", False)))
    city = str(rec.get("word", "")).split(",")[0].strip()
    won = bool(city) and city.lower() in questions[-1].lower()
    return Dialogue(tuple(questions), tuple(answers), city.title(), won)


@functools.lru_cache(maxsize=4)
def load_dialogues(path: str | Path) -> tuple[Dialogue, ...]:
    """The dialogues of a JSON file in either format of the module docstring (records may mix them)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"offline dialogues file {str(path)!r} does not exist")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of dialogues")
    return tuple(_dialogue(rec, f"{path} record {i}") for i, rec in enumerate(data))


@register(ENV_NAME)
class DialogueReplayEnv:
    """Replays recorded dialogues in the texts of the live env ``game`` (module docstring); episode ``seed``
    plays dialogue ``seed % len(dialogues)``, cut at ``max_turns`` questions."""

    def __init__(self, path: str = "", game: str = "twenty_questions", max_turns: int = 20) -> None:
        if game not in GAMES:
            raise ValueError(f"offline dialogues replay the games {', '.join(GAMES)}, not {game!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.dialogues = load_dialogues(str(path))
        self.game, self.texts, self.max_turns = game, GAMES[game], max_turns
        self.instructions = self.texts.INSTRUCTIONS.format(max_turns=max_turns)
        self.dialogue: Dialogue | None = None
        self.turns = 0
        self.done = True

    def reset(self, seed: int) -> str:
        self.dialogue = self.dialogues[seed % len(self.dialogues)]
        self.turns = 0
        self.done = False
        return self.texts.opening_text(self.max_turns)

    def legal_actions(self) -> str:
        return self.texts.legal_actions_text(self.done, self.max_turns - self.turns)

    def expert_action(self) -> str:
        """The recorded question of this turn."""
        require_active(self.dialogue is not None, self.done, ENV_NAME)
        assert self.dialogue is not None
        return self.dialogue.questions[self.turns]

    def _answer(self, recorded: str, won: bool) -> str:
        if self.game == "twenty_questions":
            return normalize_yes_no(recorded)
        assert self.dialogue is not None
        named = not won and bool(self.dialogue.word) and fold(self.dialogue.word) in fold(recorded)
        return CITY_CENSORED if named else recorded

    def step(self, action: str) -> StepResult:
        d = self.dialogue
        if self.done or d is None:
            return StepResult("The game is over.", 0.0, True, {"action_is_valid": False, "success": False})
        k = self.turns
        self.turns += 1
        won = d.success and self.turns == len(d.questions)
        self.done = won or self.turns >= min(len(d.questions), self.max_turns)
        obs = self.texts.answer_text(self._answer(d.answers[k], won), won=won, done=self.done,
                                     questions_left=self.max_turns - self.turns, secret_name=d.word)
        replayed = words(action if isinstance(action, str) else "") == words(d.questions[k])
        info = {"action_is_valid": True, "action_is_effective": True, "success": won, "turns": self.turns,
                "replayed": replayed}
        return StepResult(obs, 0.0 if won else -1.0, self.done, info)


def dialogue_problems(cfg: Any) -> list[str]:
    """Problems of ``archer.offline_dialogues`` (each names its key and the fix); [] when it is null."""
    path = cfg.archer.offline_dialogues
    if path is None:
        return []
    out = []
    if cfg.env.name not in GAMES:
        out.append(f"archer.offline_dialogues is set but env.name={cfg.env.name!r}: recorded dialogues replay "
                   f"{' or '.join(GAMES)}; set archer.offline_dialogues=null")
    if cfg.trainer.sft_warmup_steps < 1:
        out.append("archer.offline_dialogues is the warm start's data, but trainer.sft_warmup_steps=0; set it >= 1 "
                   "or archer.offline_dialogues=null")
    if cfg.sft.noise != 0:
        out.append(f"sft.noise={cfg.sft.noise} with archer.offline_dialogues: a replayed dialogue answers only its "
                   "recorded questions; set sft.noise=0")
    try:
        load_dialogues(str(path))
    except (OSError, ValueError) as exc:
        out.append(f"archer.offline_dialogues={path!r}: {exc}")
    return out


def replay_proxy(cfg: Any, path: str, engine: Any, tokenizer: Any) -> Any:
    """An agent proxy whose train envs replay the dialogues of ``path`` in the texts of ``cfg.env`` (its
    ``max_turns``, turn limits and the rollout's ``n_groups`` x ``group_size`` episodes per warm-start step)."""
    from ragen.agent import AgentProxy, EnvGroupSpec

    env = cfg.env
    config = {"path": str(path), "game": env.name, "max_turns": int(dict(env.config).get("max_turns", env.max_turn))}
    spec = EnvGroupSpec(ENV_NAME, config, cfg.rollout.n_groups, cfg.rollout.group_size, env.max_turn,
                        env.max_actions_per_turn)
    return AgentProxy(engine, tokenizer, cfg.agent_config(), [spec], [], seed=cfg.trainer.seed)
