"""A synthetic Wikipedia-style dump (JSONL ``{id, title, text}``) for tests and the bench.

Words are made of random syllables and drawn with Zipf-like frequencies (a few very common, a long tail), so
posting-list lengths look like a real corpus's. Passage i also contains two words used nowhere else
(``unique_words(i)``), so a query made of them has passage i as its only hit.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

SYLLABLES = "ka lo mi ne ru sa ti vo ze ba de fi go hu ja ke lu ma no pe ri so tu wa ye zo".split()


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """``size`` distinct pseudo-words of 2-4 syllables (never digits, never an English stop word)."""
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))] = None
    return list(words)


def unique_words(i: int) -> tuple[str, str]:
    """Two words only passage ``i`` contains (the letter q never occurs in the shared vocabulary)."""
    return f"qx{i}a", f"qz{i}b"


def passages(n: int, seed: int = 0, vocab_size: int = 20_000, words: tuple[int, int] = (30, 90)) -> Iterator[dict]:
    """``n`` passages ``{id, title, text}``: a 2-word title and ``words`` (min, max) body words."""
    rng = random.Random(seed)
    vocab = vocabulary(vocab_size, rng)
    cum_weights = list(itertools.accumulate(1.0 / (r + 1) for r in range(vocab_size)))
    for i in range(n):
        body = rng.choices(vocab, cum_weights=cum_weights, k=rng.randint(*words))
        a, b = unique_words(i)
        body[rng.randrange(len(body))] += f" {a}"
        body.append(b)
        title = " ".join(rng.choices(vocab[:2000], k=2)).title()
        yield {"id": f"doc{i}", "title": title, "text": " ".join(body) + "."}


def write_dump(path: str | Path, n: int, seed: int = 0, **kwargs) -> Path:
    """Write ``passages(n, seed)`` as JSONL to ``path``."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for record in passages(n, seed, **kwargs):
            f.write(json.dumps(record) + "\n")
    return path
