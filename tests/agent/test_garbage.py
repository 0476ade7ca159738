"""Model garbage: 10,000 adversarial responses through the parser, and thousands through every env's step
-> a format penalty or an invalid action, never an exception, a protocol break or an ``eval``."""

import ast
import builtins
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import ragen.env as E
from ragen.agent.garbage import KINDS, check_step_result, fuzz_env, fuzz_parser, garbage_responses
from ragen.env.base import StepResult

ROOT = Path(__file__).resolve().parents[2]
# responses per env in the default run (~20 s in all): 3,000, fewer for envs that score text (bm25, fuzzy match);
# bench/faults.py runs 10,000 through each
ENV_RESPONSES = 3_000
SLOW_ENVS = {"search_qa": 400, "guess_my_city": 600, "twenty_questions": 600, "static_qa": 600}


@pytest.fixture
def no_eval(monkeypatch, tmp_path):
    """Fail when model text reaches eval / exec while fuzzing (imports and dataclasses still exec their own code,
    so a call fails when its source holds model text: any of the garbage generator's markers), and run in a folder
    where the injection bait would leave a file."""
    markers = ("RAGEN_PWNED", "__import__", "__subclasses__", "DROP TABLE", "jndi", "<answer>", "\ufffd")
    real_eval, real_exec = builtins.eval, builtins.exec

    def guarded(real):
        def call(source, *a, **k):
            if isinstance(source, bytes):
                source = source.decode("utf-8", "replace")
            if isinstance(source, str) and any(m in source for m in markers):
                raise AssertionError(f"model output reached {real.__name__}: {source[:80]!r}")
            if not a and "globals" not in k:  # run in the caller's namespace, as the real builtin would
                frame = sys._getframe(1)
                a = (frame.f_globals, frame.f_locals)
            return real(source, *a, **k)

        return call

    monkeypatch.setattr(builtins, "eval", guarded(real_eval))
    monkeypatch.setattr(builtins, "exec", guarded(real_exec))
    monkeypatch.chdir(tmp_path)
    yield
    assert not (tmp_path / "RAGEN_PWNED").exists()


def test_generator_covers_every_kind_and_is_reproducible():
    first = list(garbage_responses(900, seed=3))
    assert first == list(garbage_responses(900, seed=3))
    assert {k for k, _ in first} == set(KINDS) and len(first) == 900
    texts = [t for _, t in first]
    assert max(len(t) for t in texts) > 100_000  # huge strings
    assert any(any(0xD800 <= ord(c) <= 0xDFFF for c in t) for t in texts)  # lone surrogates from byte noise
    assert any("<answer>" in t and "</answer>" in t for t in texts)


def test_parser_survives_10k_garbage_responses(no_eval):
    for think, n in ((True, 10_000), (False, 2_000)):
        rep = fuzz_parser(n, seed=int(think), think=think)
        assert rep.failures == []
        assert rep.responses == n and set(rep.by_kind.values()) == {n // 9, n // 9 + 1}
        # garbage is overwhelmingly malformed, but the wrapped kind is well-formed often enough to reach env.step
        assert 0.02 < rep.format_ok / rep.responses < 0.3


def _env_cases():
    for f in sorted((ROOT / "config" / "env").glob("*.yaml")):
        cfg = OmegaConf.load(f)
        if cfg.name != f.stem:  # a variant of an env (e.g. frozen_lake_3x3): the same code, other sizes
            continue
        if E.is_program(cfg.name):  # the user's agent program: played through the gateway, never stepped
            continue
        if cfg.name != "text_adventure":
            yield pytest.param(cfg.name, OmegaConf.to_container(cfg.config), id=cfg.name)
    yield pytest.param("text_adventure", None, id="text_adventure")


@pytest.mark.parametrize(("name", "config"), list(_env_cases()))
def test_env_steps_survive_garbage(name, config, no_eval):
    if name == "text_adventure":  # needs a game file: the contract tests' fake game drives the real wrapper
        sys.path.insert(0, str(ROOT / "tests" / "env"))
        from test_text_adventure import fake_env

        env = fake_env()
    else:
        env = E.make(name, **config)
    n = SLOW_ENVS.get(name, ENV_RESPONSES)
    rep = fuzz_env(env, n, seed=7)
    assert rep.failures == [], rep.failures[:5]
    assert rep.responses == n and rep.steps >= n and rep.resets >= 1
    assert rep.valid_actions < rep.steps  # garbage is mostly rejected as invalid (no env accepts everything)


def test_protocol_check_catches_breaks():
    ok = StepResult("obs", 0.5, False, {})
    assert check_step_result(ok) is None
    assert "finite" in check_step_result(StepResult("obs", float("nan"), False, {}))
    assert "observation" in check_step_result(StepResult(None, 0.0, False, {}))
    assert "done" in check_step_result(StepResult("o", 0.0, "yes", {}))
    assert check_step_result(StepResult("o", 1, 1, {})) is None  # ints and numpy-like 0/1 done flags are fine
    assert "finite" in check_step_result(StepResult("o", "1.0", False, {}))
    assert "StepResult" in check_step_result(("o", 0.0, False, {}))


def test_no_eval_or_exec_in_the_library():
    """Static check: nothing under ragen/ calls eval, exec or compile (model text can never reach them)."""
    calls = []
    for path in (ROOT / "ragen").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "eval", "exec", "compile"):
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == []


def test_lone_surrogates_are_replaced_at_the_agent_boundary():
    """Byte noise decoded with surrogateescape (or an API's JSON escape) made search_qa, webshop and
    text_adventure raise UnicodeEncodeError; the parser and EnvManager.step now pass valid Unicode only."""
    from ragen.agent.parser import clean_text, parse_response

    assert clean_text("a\udca0\ud800b") == "a\ufffd\ufffdb"
    assert clean_text("ok é 😀") == "ok é 😀"
    assert parse_response("<answer>x\udcff || y</answer>", think=False).actions == ["x\ufffd", "y"]


def test_static_qa_number_bomb_found_by_the_fuzz():
    """bench/faults.py found it: spaces are dropped and ``\\d`` matched Arabic-Indic digits, so
    ``"3.4028235e38 18446744073709551616 ٣"`` became a 22-digit exponent and ``Fraction`` never returned."""
    import time

    from ragen.env.static_qa import parse_number

    t0 = time.perf_counter()
    assert parse_number("3.4028235e38 18446744073709551616 ٣") is None
    assert parse_number("1e999") is not None and parse_number("1e1000") is None
    assert parse_number("٣") is None and parse_number("2.5e-3") * 400 == 1
    assert time.perf_counter() - t0 < 1.0
