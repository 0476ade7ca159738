"""What the shipped envs share between instances is safe when the envs of a batch step concurrently
(``agent.env_workers``): a record store's file, and the LLM oracle's model (built once, one answer at a time)."""

from __future__ import annotations

import functools
import threading
import time

from factories import CharTokenizer

from ragen.env import oracle as oracle_mod
from ragen.env.bm25_disk import JsonlStore, JsonlWriter
from ragen.env.oracle import LazyLLMOracle, LLMOracle, Secret
from ragen.rollout.base import Sample


def _in_threads(fn, n: int = 8) -> list:  # noqa: ANN001 - any callable of the thread index
    """``fn(k)`` for k < n, started together in n threads; the results in thread order."""
    start, out = threading.Barrier(n), [None] * n

    def run(k: int) -> None:
        start.wait()
        out[k] = fn(k)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_a_record_store_read_from_many_threads_returns_each_its_own_record(tmp_path):
    """Eight threads read interleaved records of one store (no cache, so every read seeks): each gets exactly the
    records it asked for."""
    writer = JsonlWriter(tmp_path / "recs.jsonl")
    records = [{"i": i, "text": "x" * (i % 97)} for i in range(400)]
    for rec in records:
        writer.write(rec)
    writer.close()
    store = JsonlStore(tmp_path / "recs.jsonl", cache_size=0)
    got = _in_threads(lambda k: [store[i] for _ in range(5) for i in range(k, 400, 8)])
    assert got == [[records[i] for _ in range(5) for i in range(k, 400, 8)] for k in range(8)]


class _CountingEngine:
    """Answers "yes"; records the most generate calls ever in flight at once."""

    def __init__(self) -> None:
        self.lock, self.inside, self.most = threading.Lock(), 0, 0

    def generate(self, prompts, sampling):  # noqa: ANN001, ANN201 - Engine protocol
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(0.02)
        with self.lock:
            self.inside -= 1
        return [Sample([ord(c) for c in "yes"], [0.0] * 3, "stop") for _ in prompts]


def _prompt(question: str, secret: Secret) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{secret.name}? {question}"}]


def test_llm_oracles_sharing_an_engine_answer_one_at_a_time():
    engine = _CountingEngine()
    oracles = [LLMOracle(engine, CharTokenizer(), _prompt, lambda text, s: text) for _ in range(8)]
    answers = _in_threads(lambda k: oracles[k].answer(f"q{k}", Secret("cat")))
    assert answers == ["yes"] * 8 and engine.most == 1


def test_lazy_llm_oracles_build_their_shared_model_once(monkeypatch):
    """Eight envs ask their first question at the same time: the model is built once and all use it."""
    builds = []

    @functools.lru_cache(maxsize=4)
    def build(model: str):
        builds.append(model)
        time.sleep(0.05)
        return _CountingEngine(), CharTokenizer()

    monkeypatch.setattr(oracle_mod, "_engine_and_tokenizer", build)
    oracles = [LazyLLMOracle("m", _prompt, lambda text, s: text) for _ in range(8)]
    assert _in_threads(lambda k: oracles[k].answer("q", Secret("cat"))) == ["yes"] * 8
    assert builds == ["m"] and len({id(o._oracle.engine) for o in oracles}) == 1
