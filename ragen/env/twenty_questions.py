"""Twenty Questions (the ArCHer environment): find the secret object by asking yes/no questions.

Each step is one question (the content of the model's answer tag). The oracle answers ``Yes``, ``No`` or
``Invalid``. The episode is won by a ``Yes`` to a question whose last word(s) name the secret object or one of
its aliases ("Is it a dog?" for dog; multi-word names such as "teddy bear" are matched as a whole, the longest
name in the table wins, so "Is it a teddy bear?" does not name "bear"). Reward: -1 per question, 0 on the
winning question; at most ``max_turns`` (20) questions. Blank questions (no letters or digits) are invalid: they
cost -1 but no question.

Secrets are drawn per seed from the shipped table ``ragen/data/twenty_questions/objects.csv`` (135 objects,
31 yes/no attributes; semantics in that folder's README), or from ``objects_path``: a shipped table's name
(``SHIPPED_TABLES``: ``full``, or ``small``, the 8 objects of ``objects_small.csv`` that the CPU ArCHer run learns
on) or a CSV path with the same columns. ``secret_order``: ``random`` (the object is drawn with the seed's own
random stream) or ``cycle`` (object ``seed mod n`` of the table): with ``cycle`` any ``k * n`` consecutive seeds hold
every object ``k`` times, a balanced validation panel on which a player that ignores the answers and guesses
``max_turns`` fixed objects wins exactly ``max_turns / n`` of the games (``ragen.evaluation.open_loop``).

Scripted oracle (``oracle="scripted"``), in order:

1. guess: the question is a guess prefix ("is it", "is this", "could it be", "my guess is", ...) then at most
   three filler words (no comparison words such as "than", "of", "like") then an object name at its end:
   ``Yes`` iff that object is the secret;
2. negated ("not", "never", "...n't") or alternative ("or") questions: ``Invalid`` (not parsed);
3. size comparisons "bigger/larger/taller/longer/heavier (or smaller/shorter/lighter) than a breadbox /
   person" map to ``bigger_than_breadbox`` / ``bigger_than_person``; any other "than" comparison is ``Invalid``;
4. keywords (``KEYWORD_RULES``, whole words) map to attributes, some negatively ("small" = not
   ``bigger_than_breadbox``, "natural" = not ``is_man_made``); several matches are a conjunction ("a big
   animal" = big and animal), contradicting ones are ``Invalid``;
5. anything else: ``Invalid``.

Expert (``expert_action``): ``oracle.QuestionPlanner`` over the object table with the scripted oracle: keep the
objects consistent with the answers so far (``history``), ask the attribute question of ``EXPERT_QUESTIONS`` that
best halves them, guess ("Is it a dog?") when one is left or no question splits them (objects with identical
attributes), and guess on the last question. It plays the scripted oracle's game; with ``oracle="llm"`` it still
plays, but its simulated answers are the table's, so the LLM's mistakes can mislead it.
"""

from __future__ import annotations

import csv
import functools
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ragen.env.base import StepResult, register
from ragen.env.oracle import (
    INVALID,
    NO,
    YES,
    Oracle,
    QuestionPlanner,
    ScriptedOracle,
    Secret,
    check_llm_only_keys,
    llm_oracle_for_model,
    normalize_yes_no,
    words,
)
from ragen.env.text_utils import require_active

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "twenty_questions"
DEFAULT_OBJECTS = DATA_DIR / "objects.csv"
# Tables shipped in ragen/data/twenty_questions/, by the name ``objects_path`` may give instead of a path.
SHIPPED_TABLES: dict[str, Path] = {"full": DEFAULT_OBJECTS, "small": DATA_DIR / "objects_small.csv"}

# (regex over the folded question, attribute, polarity); regexes are matched on whole words.
KEYWORD_RULES: tuple[tuple[str, str, bool], ...] = (
    (r"animals?|creatures?|beasts?|critters?", "is_animal", True),
    (r"mammals?", "is_mammal", True),
    (r"birds?", "is_bird", True),
    (r"fish|fishes", "is_fish", True),
    (r"insects?|bugs?", "is_insect", True),
    (r"water|aquatic|swims?|swimming|ocean|sea|river|lake|pond|marine|underwater", "in_water", True),
    (r"fly|flies|flying|airborne", "can_fly", True),
    (r"pets?", "is_pet", True),
    (r"fur|furry|hair|hairy|fluffy|wool|woolly", "has_fur", True),
    (r"(lays?|laying) eggs?|egg-laying", "lays_eggs", True),
    (r"legs?", "has_legs", True),
    (r"plants?|vegetation|flora", "is_plant", True),
    (r"alive|living(?! room)|organisms?|life form", "is_alive", True),
    (r"edible|food|foods|eaten|eat it|can (you|i|we|one|people|humans|someone) eat|snack|meal|tasty|delicious",
     "edible", True),
    (r"fruits?", "is_fruit", True),
    (r"vegetables?|veggies?", "is_vegetable", True),
    (r"man-made|man made|manmade|human-made|manufactured|artificial|made by (humans|people|man)", "is_man_made",
     True),
    (r"natural|naturally|nature", "is_man_made", False),
    (r"fits? (in|into|inside) (a |an |the )?bread ?box", "bigger_than_breadbox", False),
    (r"big|bigger|large|larger|huge|giant|enormous", "bigger_than_breadbox", True),
    (r"small|smaller|tiny|little|miniature", "bigger_than_breadbox", False),
    (r"kitchen|cook|cooking|cookware|utensils?|tableware|cutlery", "kitchen_item", True),
    (r"wheels?|wheeled", "has_wheels", True),
    (r"electronic|electronics|electric|electrical|electricity|battery|batteries|plug|plugged", "electronic", True),
    (r"screens?|display|monitor", "has_screen", True),
    (r"vehicles?|transportation|transport", "is_vehicle", True),
    (r"furniture", "is_furniture", True),
    (r"tools?", "is_tool", True),
    (r"clothing|clothes|garments?|apparel|wear|wearable|worn|outfit", "is_clothing", True),
    (r"instruments?|musical|music", "is_instrument", True),
    (r"sports?|sporting|athletic|exercise", "is_sports_equipment", True),
    (r"metal|metallic|steel|iron|aluminum|aluminium", "made_of_metal", True),
    (r"wood|wooden|timber", "made_of_wood", True),
)
# The expert's question bank: one question per attribute of the shipped table, each read by exactly that
# attribute's keyword rule (the tests check that no object gets "Invalid").
EXPERT_QUESTIONS: tuple[str, ...] = (
    "Is it an animal?", "Is it alive?", "Is it man-made?", "Is it bigger than a breadbox?",
    "Is it bigger than a person?", "Is it edible?", "Is it a mammal?", "Is it a bird?", "Is it a fish?",
    "Is it an insect?", "Does it live in water?", "Can it fly?", "Is it a pet?", "Does it have fur?",
    "Does it lay eggs?", "Does it have legs?", "Is it a plant?", "Is it a fruit?", "Is it a vegetable?",
    "Is it a kitchen item?", "Does it have wheels?", "Is it electronic?", "Does it have a screen?",
    "Is it a vehicle?", "Is it furniture?", "Is it a tool?", "Is it clothing?", "Is it a musical instrument?",
    "Is it sports equipment?", "Is it made of metal?", "Is it made of wood?",
)
_COMPARISON = re.compile(
    r"\b(?P<dir>bigger|larger|taller|longer|heavier|smaller|shorter|lighter) than (a |an |the )?"
    r"(?P<ref>bread ?box|person|human|man|woman|adult|people|me|you)\b"
)
_GUESS_PREFIXES: tuple[tuple[str, ...], ...] = tuple(
    tuple(p.split())
    for p in (
        "is it", "is this", "is that", "it is", "it's", "its", "could it be", "might it be", "would it be",
        "can it be", "are you thinking of", "is the object", "is the answer", "is the secret object",
        "the answer is", "the object is", "my guess is", "i guess", "i think it is", "i think it's", "guess",
    )
)
_FILLER_STOP = frozenset(
    "than like as of with for from in on to by made used near inside part kind type sort or and not never "
    "bigger smaller larger".split()
)


@dataclass(frozen=True)
class GameObject:
    """One row of the object table: name, aliases and the yes/no attribute values."""

    name: str
    aliases: tuple[str, ...]
    attributes: dict[str, bool]


def resolve_objects_path(objects_path: str | Path | None) -> Path:
    """``objects_path`` -> the table's file: ``None`` is the full shipped table, a name of ``SHIPPED_TABLES``
    (``full``, ``small``) that shipped table, anything else a CSV path. A bare word that names no shipped table
    (no folder, no suffix: ``"smal"``) is an error listing the names, not a missing file in the working folder."""
    if objects_path is None:
        return DEFAULT_OBJECTS
    text = str(objects_path)
    if text in SHIPPED_TABLES:
        return SHIPPED_TABLES[text]
    path = Path(text)
    if len(path.parts) == 1 and not path.suffix:
        raise ValueError(f"env.config.objects_path={text!r} is neither a shipped table ({', '.join(SHIPPED_TABLES)}) "
                         "nor a CSV path; use one of those names or a path such as data/my_objects.csv")
    return path


def load_objects(path: str | Path = DEFAULT_OBJECTS) -> list[GameObject]:
    """Read an object table CSV: columns ``name``, ``aliases`` (``|``-separated) and one 0/1 column per attribute."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"twenty_questions objects table {str(path)!r} does not exist; pass objects_path=...")
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or "name" not in rows[0] or "aliases" not in rows[0]:
        raise ValueError(f"{path}: expected a CSV with columns name, aliases, <attribute>...")
    attrs = [k for k in rows[0] if k not in ("name", "aliases")]
    objects = []
    for i, row in enumerate(rows):
        bad = {a: row[a] for a in attrs if row[a] not in ("0", "1")}
        if bad:
            raise ValueError(f"{path} row {i + 2} ({row['name']!r}): attribute values must be 0 or 1, got {bad}")
        aliases = tuple(a.strip() for a in row["aliases"].split("|") if a.strip())
        objects.append(GameObject(row["name"].strip(), aliases, {a: row[a] == "1" for a in attrs}))
    return objects


class NameIndex:
    """Finds which object of the table a question names at its end (longest multi-word name wins)."""

    def __init__(self, objects: list[GameObject]) -> None:
        self.by_words: dict[tuple[str, ...], str] = {}
        for obj in objects:
            for name in (obj.name, *obj.aliases):
                self.by_words.setdefault(tuple(words(name)), obj.name)
        self.max_len = max((len(k) for k in self.by_words), default=0)

    def named_at_end(self, toks: list[str]) -> tuple[str, int] | None:
        """``(object name, number of words)`` of the longest table name that ends ``toks``, else ``None``."""
        for n in range(min(self.max_len, len(toks)), 0, -1):
            hit = self.by_words.get(tuple(toks[-n:]))
            if hit is not None:
                return hit, n
        return None

    def guessed(self, question: str) -> str | None:
        """The object a guess-shaped question names ("is it a dog", "my guess is the teddy bear"), else None."""
        toks = words(question)
        found = self.named_at_end(toks)
        if found is None:
            return None
        rest = toks[: len(toks) - found[1]]
        for prefix in sorted(_GUESS_PREFIXES, key=len, reverse=True):
            if tuple(rest[: len(prefix)]) == prefix:
                rest = rest[len(prefix) :]
                break
        else:
            if len(rest) > 1:  # a bare name ("dog", "a dog") is a guess too; other shapes are not
                return None
        if len(rest) > 3 or any(t in _FILLER_STOP for t in rest):
            return None
        return found[0]


def attribute_answer(question: str, attributes: dict[str, bool]) -> str:
    """Steps 2-5 of the scripted oracle (see the module docstring) for one object's attributes."""
    toks = words(question)
    if not toks:
        return INVALID
    if "or" in toks or any(t in ("not", "never", "cannot") or t.endswith("n't") for t in toks):
        return INVALID
    text = " ".join(toks)
    wanted: dict[str, bool] = {}
    for m in _COMPARISON.finditer(text):
        attr = "bigger_than_breadbox" if m.group("ref").startswith("bread") else "bigger_than_person"
        wanted[attr] = m.group("dir") in ("bigger", "larger", "taller", "longer", "heavier")
    text = _COMPARISON.sub(" ", text)
    if re.search(r"\bthan\b", text):
        return INVALID
    for pattern, attr, polarity in KEYWORD_RULES:
        if re.search(rf"\b(?:{pattern})\b", text):
            if wanted.get(attr, polarity) != polarity:
                return INVALID
            wanted[attr] = polarity
    if not wanted or any(a not in attributes for a in wanted):
        return INVALID
    return YES if all(attributes[a] == v for a, v in wanted.items()) else NO


def scripted_oracle(objects: list[GameObject]) -> ScriptedOracle:
    """The rule-based oracle over an object table (module docstring, steps 1-5)."""
    index = NameIndex(objects)

    def guess_rule(question: str, secret: Secret) -> str | None:
        guessed = index.guessed(question)
        if guessed is None:
            return None
        return YES if guessed == secret.name else NO

    def attribute_rule(question: str, secret: Secret) -> str | None:
        return attribute_answer(question, dict(secret.facts))

    return ScriptedOracle([guess_rule, attribute_rule], default=INVALID)


def llm_prompt(question: str, secret: Secret) -> list[dict[str, str]]:
    """Chat messages for the LLM oracle: the secret object in the system message, the question as the user's."""
    system = (
        f'You are the answerer in a game of twenty questions. The secret object is "{secret.name}". '
        f'Answer the player\'s question about "{secret.name}" truthfully with one word: Yes or No. '
        "If the question cannot be answered with yes or no, answer Invalid."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def llm_postprocess(text: str, secret: Secret) -> str:
    """LLM oracle text -> Yes/No/Invalid."""
    return normalize_yes_no(text)


def build_oracle(kind: str, objects: list[GameObject], oracle_model: str, max_new_tokens: int) -> Oracle:
    """``"scripted"`` (table rules) or ``"llm"`` (lazily built engine over ``oracle_model``)."""
    if kind == "scripted":
        return scripted_oracle(objects)
    if kind == "llm":
        return llm_oracle_for_model(oracle_model, llm_prompt, llm_postprocess, max_new_tokens)
    raise ValueError(f"unknown oracle {kind!r}; use 'scripted' or 'llm'")


def guess_question(name: str) -> str:
    """The winning question for object ``name``: "Is it a dog?" / "Is it an apple?"."""
    return f"Is it {'an' if name[:1].lower() in 'aeiou' else 'a'} {name}?"


@functools.lru_cache(maxsize=8)
def expert_planner(objects_path: str) -> QuestionPlanner:
    """The expert's planner for an object table (shared by every env on that table)."""
    objects = load_objects(objects_path)
    secrets = [Secret(o.name, o.aliases, o.attributes) for o in objects]
    return QuestionPlanner(scripted_oracle(objects), secrets, EXPERT_QUESTIONS, lambda s: guess_question(s.name))


INSTRUCTIONS = (
    "Let's play Twenty Questions. I am thinking of an object (an animal, plant, food, household item, vehicle, "
    "tool, piece of clothing, instrument, ...). Ask one yes/no question per turn, e.g. 'Is it an animal?' or "
    "'Is it bigger than a breadbox?'. I answer Yes, No, or Invalid (for questions I cannot answer with yes or "
    "no). To win, guess the object with a question ending in its name, e.g. 'Is it a dog?'. You have at most "
    "{max_turns} questions and every question costs -1, so find it quickly. Put only your question in the "
    "answer tag."
)


def opening_text(max_turns: int) -> str:
    """The first observation of a game."""
    return f"I am thinking of an object. You have {max_turns} questions. Ask your first question."


def legal_actions_text(done: bool, questions_left: int) -> str:
    """What ``legal_actions`` shows."""
    if done:
        return "The game is over."
    return (f"Any yes/no question about the object (e.g. 'Is it an animal?'), or a guess 'Is it a <object>?'. "
            f"Questions left: {questions_left}.")


def answer_text(answer: str, *, won: bool, done: bool, questions_left: int, secret_name: str) -> str:
    """The observation after a question: the oracle's ``answer`` (Yes / No / Invalid) and what is left."""
    if won:
        return f"Answer: Yes. You guessed it: the object is {secret_name}."
    if done:
        return f"Answer: {answer}. No questions left; the object was {secret_name}."
    return f"Answer: {answer}. Questions left: {questions_left}."


SECRET_ORDERS = ("random", "cycle")


@register("twenty_questions")
class TwentyQuestionsEnv:
    """Twenty Questions (see the module docstring); config keys are the constructor's keyword arguments."""

    DEFAULT_MAX_TURN = 20  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    def __init__(
        self,
        oracle: str = "scripted",
        oracle_model: str = "smollm2-135m-instruct",
        oracle_max_new_tokens: int = 16,
        max_turns: int = 20,
        objects_path: str | None = None,
        secret_order: str = "random",
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if secret_order not in SECRET_ORDERS:
            raise ValueError(f"secret_order={secret_order!r} is not one of {', '.join(SECRET_ORDERS)} (random: drawn "
                             "per seed; cycle: object seed mod n, a balanced panel over consecutive seeds)")
        self.secret_order = secret_order
        self.objects_path = str(resolve_objects_path(objects_path))
        self.objects = load_objects(self.objects_path)
        self.index = NameIndex(self.objects)
        check_llm_only_keys(type(self), oracle, {"oracle_model": oracle_model,
                                                 "oracle_max_new_tokens": oracle_max_new_tokens})
        self.oracle = build_oracle(oracle, self.objects, oracle_model, oracle_max_new_tokens)
        self.max_turns = max_turns
        self.instructions = INSTRUCTIONS.format(max_turns=max_turns)
        self.secret: Secret | None = None
        self.turns = 0
        self.history: list[tuple[str, str]] = []  # (question, oracle answer) of this episode's questions
        self.done = True

    def reset(self, seed: int) -> str:
        n = len(self.objects)
        obj = self.objects[seed % n if self.secret_order == "cycle" else random.Random(seed).randrange(n)]
        self.secret = Secret(obj.name, obj.aliases, obj.attributes, description=f"The object is {obj.name}.")
        self.turns = 0
        self.history = []
        self.done = False
        return opening_text(self.max_turns)

    def legal_actions(self) -> str:
        return legal_actions_text(self.done, self.max_turns - self.turns)

    def expert_action(self) -> str:
        """The expert's next question (module docstring); reads the state only."""
        require_active(self.secret is not None, self.done, "twenty_questions")
        return expert_planner(self.objects_path).next_question(self.history, self.max_turns - self.turns)

    def step(self, action: str) -> StepResult:
        if self.done or self.secret is None:
            return StepResult("The game is over.", 0.0, True, {"action_is_valid": False, "success": False})
        question = action if isinstance(action, str) else ""
        if not words(question):
            info = {"action_is_valid": False, "action_is_effective": False, "success": False, "turns": self.turns}
            return StepResult("Please ask a yes/no question about the object.", -1.0, False, info)
        answer = self.oracle.answer(question.strip(), self.secret)
        self.turns += 1
        self.history.append((question.strip(), answer))
        named = self.index.named_at_end(words(question))
        won = answer == YES and named is not None and named[0] == self.secret.name
        self.done = won or self.turns >= self.max_turns
        obs = answer_text(answer, won=won, done=self.done, questions_left=self.max_turns - self.turns,
                          secret_name=self.secret.name)
        info = {
            "action_is_valid": True,
            "action_is_effective": answer in (YES, NO),
            "success": won,
            "answer": answer,
            "turns": self.turns,
        }
        return StepResult(obs, 0.0 if won else -1.0, self.done, info)
