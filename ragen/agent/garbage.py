"""Adversarial model output for fault injection (model garbage): what a diverged policy may emit for hours, and a
harness that pushes it through the response parser and an env's ``step``.

:func:`garbage_responses` draws, from a seeded ``random.Random``, responses of nine kinds (:data:`KINDS`): byte
noise (decoded with ``replace`` or ``surrogateescape``, so lone surrogates too), huge strings, nested and
unbalanced tags, exotic unicode (controls, NUL, RTL, zero-width, combining marks, astral emoji), numbers at the
float limits, code-injection bait (``__import__('os')...``, template and shell syntax), the env's legal actions
mangled, and well-formed ``<think>/<answer>`` wrappers around any of these (so garbage reaches ``env.step``).
:func:`fuzz_env` checks each step against the env protocol (``ragen.env.base``): a ``StepResult`` with a ``str``
observation, a finite float reward, a bool ``done`` and the required info keys, and never an exception.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ragen.agent.parser import clean_text, parse_response
from ragen.env.base import REQUIRED_INFO_KEYS, step_result_problem

KINDS = ("bytes", "huge", "tags", "unicode", "numbers", "injection", "mangled_action", "wrapped", "empty")
TAGS = ("<think>", "</think>", "<answer>", "</answer>", "<answer", "answer>", "<<answer>>", "</answer></answer>",
        "<tool>", "</tool>", "<result>", "<ANSWER>", "< answer >", "<think><answer>", "||", "|", "\n")
NUMBERS = ("1e309", "-1e309", "nan", "NaN", "inf", "-inf", "1.7976931348623157e308", "5e-324", "-0.0", "0x1p1024",
           "9" * 400, "-" + "9" * 40, "1_000_000", "2**1024", "9**9**9", "(1e308*10)", "1/0", "0/0", "1e-400",
           "3.4028235e38", "-2147483649", "18446744073709551616", "½", "٣", "１２")
INJECTION = ("__import__('os').system('touch RAGEN_PWNED')", "eval('1+1')", "exec('import os')", "lambda: 0",
             "{{7*7}}", "${jndi:ldap://x}", "$(rm -rf /)", "`id`", "'; DROP TABLE items; --", "%s%s%s%n",
             "open('/etc/passwd').read()", "().__class__.__bases__[0].__subclasses__()", "\\x00\\u0000",
             "<script>alert(1)</script>", "{'a': [1, 2]}", "[[[[[[]]]]]]", "\x1b[2J\x1b[H")
UNICODE_RANGES = ((0x0, 0x20), (0x7F, 0xA0), (0x300, 0x36F), (0x590, 0x6FF), (0x200B, 0x200F), (0x202A, 0x202E),
                  (0x4E00, 0x4E80), (0xFFF0, 0xFFFF), (0x1F600, 0x1F64F), (0xE0000, 0xE007F))
HUGE_CAP = 200_000


def _unicode(rng: random.Random, n: int) -> str:
    return "".join(chr(rng.randint(*rng.choice(UNICODE_RANGES))) for _ in range(n))


def _bytes(rng: random.Random, n: int) -> str:
    return rng.randbytes(n).decode("utf-8", errors=rng.choice(("replace", "surrogateescape", "ignore")))


def _one(kind: str, rng: random.Random, actions: list[str], huge_cap: int) -> str:
    if kind == "bytes":
        return _bytes(rng, rng.randint(0, 300))
    if kind == "huge":
        unit = rng.choice(["a", "<answer>", "</think>", " || ", "x" * 7 + " ", "é", "\n", "9"])
        return unit * (rng.randint(1, huge_cap) // len(unit))
    if kind == "tags":
        return "".join(rng.choice(TAGS) if rng.random() < 0.6 else rng.choice(["up", " ", "x", "1", "a b"])
                       for _ in range(rng.randint(1, 60)))
    if kind == "unicode":
        return _unicode(rng, rng.randint(0, 80))
    if kind == "numbers":
        return " ".join(rng.choice(NUMBERS) for _ in range(rng.randint(1, 5)))
    if kind == "injection":
        return rng.choice(INJECTION)
    if kind == "mangled_action":
        act = rng.choice(actions) if actions else "up"
        ops = [act.upper(), act.lower(), f"  {act}  ", act[::-1], act + rng.choice(NUMBERS), act * 3,
               act.replace(" ", "\t"), act + "\x00", f"{act} || {act} || {act}", act[: max(1, len(act) // 2)]]
        return rng.choice(ops)
    if kind == "wrapped":
        inner = _one(rng.choice(KINDS[:7]), rng, actions, min(huge_cap, 5_000))
        return f"<think>{_one('unicode', rng, actions, huge_cap)}</think><answer>{inner}</answer>"
    return rng.choice(["", " ", "\n\n", "<answer></answer>", "<think></think><answer> || </answer>"])


def garbage_responses(n: int, seed: int = 0, actions: list[str] | tuple[str, ...] = (),
                      huge_cap: int = HUGE_CAP) -> Iterator[tuple[str, str]]:
    """``n`` ``(kind, response)`` pairs, the kinds in turn (so every kind gets ``n / len(KINDS)``), reproducible
    from ``seed``. ``actions``: legal action texts to mangle; ``huge_cap``: longest huge string (characters)."""
    rng = random.Random(seed)
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        yield kind, _one(kind, rng, list(actions), huge_cap)


@dataclass
class FuzzReport:
    """Counts of one fuzz run: responses tried, well-formed ones, env steps taken / valid, and failures."""

    responses: int = 0
    format_ok: int = 0
    steps: int = 0
    valid_actions: int = 0
    resets: int = 0
    by_kind: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def fuzz_parser(n: int, seed: int = 0, *, think: bool = True, action_sep: str = "||") -> FuzzReport:
    """Parse ``n`` garbage responses; a failure is any exception or a non-list / non-str result."""
    rep = FuzzReport()
    for kind, text in garbage_responses(n, seed):
        rep.responses += 1
        rep.by_kind[kind] += 1
        try:
            parsed = parse_response(text, think=think, action_sep=action_sep)
            if not all(isinstance(a, str) and a for a in parsed.actions):
                raise TypeError(f"actions {parsed.actions!r}")
            rep.format_ok += parsed.format_ok
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            rep.failures.append(f"{kind}: {type(exc).__name__}: {exc} on {text[:80]!r}")
    return rep


def check_step_result(res: Any) -> str | None:
    """Why ``res`` breaks the env protocol (None when it does not): ``step_result_problem`` plus the info keys
    every env must report."""
    problem = step_result_problem(res)
    if problem is not None:
        return problem
    missing = [k for k in REQUIRED_INFO_KEYS if k not in res.info]
    return f"info lacks {missing}" if missing else None


def fuzz_env(env: Any, n: int, seed: int = 0, *, max_actions: int = 2, think: bool = False,
             huge_cap: int = 20_000) -> FuzzReport:
    """Feed ``n`` garbage responses to ``env`` as the agent would: parse; a well-formed answer's actions (at most
    ``max_actions``) are stepped, and a malformed response's raw text is stepped too (harsher than the proxy,
    which skips it), after :func:`clean_text` as ``EnvManager.step`` does. Resets with a new seed when an episode
    ends. Failures: exceptions and protocol breaks."""
    rep = FuzzReport()
    episode = 0
    env.reset(seed)
    rep.resets += 1
    legal = [a.strip() for a in str(env.legal_actions()).replace("[", ",").replace("]", ",").split(",") if a.strip()]
    for kind, text in garbage_responses(n, seed, legal, huge_cap):
        rep.responses += 1
        rep.by_kind[kind] += 1
        parsed = parse_response(text, think=think)
        rep.format_ok += parsed.format_ok
        for action in (parsed.actions[:max_actions] if parsed.format_ok else [clean_text(text)]):
            try:
                res = env.step(action)
                problem = check_step_result(res)
            except Exception as exc:  # noqa: BLE001 - the failure is the finding
                res, problem = None, f"{type(exc).__name__}: {exc}"
            rep.steps += 1
            if problem is not None:
                rep.failures.append(f"{kind}: {problem} on {action[:80]!r}")
                continue
            rep.valid_actions += bool(res.info.get("action_is_valid"))
            if res.done:
                episode += 1
                env.reset(seed + episode)
                rep.resets += 1
                break
    return rep
