"""Static QA: answer a question from a fixed dataset, in one or several attempts (math-style sets: GSM8K, MATH...).

Each episode is one question (``reset(seed)`` takes item ``seed % len(data)``, so seeds 0..N-1 cover the set
once). Each step is one attempt: the action is the content of the model's answer tag. The predicted answer is
the last ``\\boxed{...}`` in it if there is one, else the text after the last ``####``, else the whole text.
It is correct when it equals the gold answer after normalisation: numbers compare numerically when both parse
(``1,000`` = ``1000.0``, ``$42`` = ``42``, ``50%`` = ``50``, ``3/4`` = ``0.75``), other text after lowercasing,
dropping punctuation, articles and extra whitespace. Reward ``1 / 2**k`` for a correct answer on attempt ``k``
(0-based: 1, 0.5, 0.25, ...), 0 for a wrong one; the episode ends on a correct answer or after
``max_attempts``. Blank answers are invalid: reward 0, no attempt used.

Data: JSONL, JSON (a list of objects) or parquet with ``question_key`` / ``answer_key`` fields; gold answers
are extracted like predictions (``answer_format="auto"``: ``\\boxed{}`` then ``####`` then the whole field;
``"gsm8k"``: text after ``####`` (required); ``"boxed"``: last ``\\boxed{}`` (required); ``"plain"``: whole
field). The default is a 30-question sample shipped in ``ragen/data/static_qa/sample.jsonl``.

Expert (``expert_action``): the gold answer (as extracted from the data), on every attempt.
"""

from __future__ import annotations

import json
import re
import string
from fractions import Fraction
from pathlib import Path

from ragen.env.base import StepResult, register
from ragen.env.text_utils import require_active

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "data" / "static_qa" / "sample.jsonl"
ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "plain")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None


def extract_answer(text: str, answer_format: str = "auto") -> str | None:
    """The final answer in ``text`` per ``answer_format`` (see the module docstring); None when required but absent."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"unknown answer_format {answer_format!r}; use one of {ANSWER_FORMATS}")
    text = text if isinstance(text, str) else str(text)
    if answer_format in ("auto", "boxed"):
        boxed = last_boxed(text)
        if boxed is not None or answer_format == "boxed":
            return boxed
    if answer_format in ("auto", "gsm8k"):
        if "####" in text:
            return text.rsplit("####", 1)[1].strip()
        if answer_format == "gsm8k":
            return None
    return text.strip()


MAX_NUMBER_CHARS = 64


def parse_number(text: str) -> Fraction | None:
    """``"1,234.5"``, ``"$42"``, ``"50%"``, ``"-3/4"``, ``"\\frac{3}{4}"`` -> exact Fraction; None if not a number."""
    s = text.strip().rstrip(".").replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\!", "").replace("{,}", "").replace(" ", "")
    m = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if len(s) > MAX_NUMBER_CHARS or not re.fullmatch(
            r"-?(\d+(\.\d*)?|\.\d+)(/-?\d+)?|-?\d+(\.\d+)?e-?\d{1,3}", s, flags=re.ASCII):
        return None  # ASCII digits only, exponents below 1000: Fraction("1e3818446744073709551616") never returns
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def normalize_text(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD-style)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answers_match(prediction: str, gold: str) -> bool:
    """Exact match after normalisation; numeric comparison when both sides parse as numbers."""
    p_num, g_num = parse_number(prediction), parse_number(gold)
    if p_num is not None and g_num is not None:
        return p_num == g_num
    return normalize_text(prediction) == normalize_text(gold) and normalize_text(gold) != ""


def load_qa(path: str | Path, question_key: str, answer_key: str) -> list[dict]:
    """Rows of a JSONL / JSON / parquet file, checked to carry ``question_key`` and ``answer_key``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"static_qa data file {str(path)!r} does not exist; pass data_path=...")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    if not rows:
        raise ValueError(f"static_qa data file {str(path)!r} has no rows")
    missing = [k for k in (question_key, answer_key) if k not in rows[0]]
    if missing:
        raise ValueError(f"{path}: rows lack key(s) {missing}; available: {sorted(rows[0])}. "
                         "Set question_key / answer_key.")
    return rows


INSTRUCTIONS = (
    "Answer the question. Think step by step if you like, then put only the final answer in the answer tag "
    "(a number, or a short phrase). You have {max_attempts} attempt(s); a correct answer on attempt k (counting "
    "from 0) earns 1/2^k."
)


@register("static_qa")
class StaticQAEnv:
    """Static QA (see the module docstring); config keys are the constructor's keyword arguments."""

    DEFAULT_MAX_TURN = 1  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    def __init__(
        self,
        data_path: str | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        answer_format: str = "auto",
        max_attempts: int = 1,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"unknown answer_format {answer_format!r}; use one of {ANSWER_FORMATS}")
        rows = load_qa(data_path or DEFAULT_DATA, question_key, answer_key)
        self.items: list[tuple[str, str]] = []
        for i, row in enumerate(rows):
            gold = extract_answer(str(row[answer_key]), answer_format)
            if gold is None:
                raise ValueError(f"row {i}: no {answer_format} answer in {answer_key}={row[answer_key]!r}")
            self.items.append((str(row[question_key]), gold))
        self.max_attempts = max_attempts
        self.instructions = INSTRUCTIONS.format(max_attempts=max_attempts)
        self.question, self.gold = "", ""
        self.attempt = 0
        self.done = True
        self._started = False

    def reset(self, seed: int) -> str:
        self.question, self.gold = self.items[seed % len(self.items)]
        self.attempt = 0
        self.done = False
        self._started = True
        return self.question

    def legal_actions(self) -> str:
        if self.done:
            return "The episode is over."
        return f"Your final answer. Attempts left: {self.max_attempts - self.attempt}."

    def expert_action(self) -> str:
        """The gold answer of the current question."""
        require_active(self._started, self.done, "static_qa")
        return self.gold

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult("The episode is over.", 0.0, True, {"action_is_valid": False, "success": False})
        text = action if isinstance(action, str) else ""
        prediction = extract_answer(text, "auto") or ""
        if not prediction.strip():
            info = {"action_is_valid": False, "action_is_effective": False, "success": False}
            return StepResult("Please give an answer.", 0.0, False, info)
        correct = answers_match(prediction, self.gold)
        reward = 1.0 / 2**self.attempt if correct else 0.0
        self.attempt += 1
        self.done = correct or self.attempt >= self.max_attempts
        if correct:
            obs = "Correct."
        elif self.done:
            obs = "Incorrect. No attempts left."
        else:
            obs = f"Incorrect. Try again ({self.max_attempts - self.attempt} attempt(s) left)."
        info = {"action_is_valid": True, "action_is_effective": True, "success": correct, "attempt": self.attempt,
                "prediction": prediction}
        return StepResult(obs, reward, self.done, info)
