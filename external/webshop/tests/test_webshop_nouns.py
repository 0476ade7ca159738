"""The converter's name nouns: spaCy batched by chunk (through a fake spaCy pipeline injected at ``spacy.load``),
the ``auto`` fallback to the heuristic when the model is missing, and its progress bars."""

from __future__ import annotations

import json
import re
from typing import NamedTuple

import pytest
from tqdm import tqdm

pytest.importorskip("ijson", reason="the webshop extra is not installed: pip install -e .[webshop]")

from ragen_external.webshop import convert  # noqa: E402
from ragen_external.webshop.sample import write_files  # noqa: E402

from ragen.env.webshop.data import load_catalog  # noqa: E402
from ragen.env.webshop.scoring import heuristic_nouns, spacy_noun_extractor  # noqa: E402

N, CHUNK, BATCH = 130, 64, 16
POS_PIPES = {"tok2vec", "tagger", "attribute_ruler"}


class FakeToken(NamedTuple):
    text: str
    pos_: str


class FakeNLP:
    """A spaCy-like pipeline: ``pipe_names``, ``nlp(text)`` and ``nlp.pipe(texts, batch_size=, disable=)``. Tags:
    capitalised word -> PROPN, a word of 5+ letters -> NOUN, else ADJ; no POS at all when a component that sets
    it is disabled (as in spaCy). Records each ``pipe`` call: (number of texts, batch_size, disable)."""

    pipe_names = ["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "ner"]

    def __init__(self):
        self.calls, self.pipes = 0, []

    @staticmethod
    def doc(text: str, tagged: bool = True) -> list[FakeToken]:
        def pos(w: str) -> str:
            return "" if not tagged else "PROPN" if w[:1].isupper() else "NOUN" if len(w) >= 5 else "ADJ"

        return [FakeToken(w, pos(w)) for w in re.findall(r"\w+", text)]

    def __call__(self, text: str) -> list[FakeToken]:
        self.calls += 1
        return self.doc(text)

    def pipe(self, texts, batch_size=None, disable=()):
        texts = list(texts)
        self.pipes.append((len(texts), batch_size, list(disable)))
        return (self.doc(t, tagged=not POS_PIPES & set(disable)) for t in texts)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("webshop_nouns"), N, seed=5)


def run(raw, out, **kwargs):
    return convert.convert(raw["items_shuffle"], raw["items_ins_v2"], raw["items_human_ins"], out, **kwargs)


def test_spacy_nouns_are_tagged_one_chunk_at_a_time(raw, tmp_path, monkeypatch):
    spacy = pytest.importorskip("spacy", reason="spaCy is not installed (the fake pipeline replaces spacy.load)")
    fake = FakeNLP()
    monkeypatch.setattr(spacy, "load", lambda name, **kw: fake if name == "fake_model" else pytest.fail(name))
    convert.main(["--items", str(raw["items_shuffle"]), "--attrs", str(raw["items_ins_v2"]), "--human",
                  str(raw["items_human_ins"]), "--out", str(tmp_path / "conv"), "--nouns", "spacy", "--spacy-model",
                  "fake_model", "--chunk-size", str(CHUNK), "--noun-batch-size", str(BATCH), "--no-progress"])
    assert json.loads((tmp_path / "conv" / "catalog.json").read_text())["noun_extractor"] == "spacy:fake_model"
    # one pipe call per chunk (64 + 64 + 2 titles), parser / lemmatizer / ner off, no per-title calls
    assert fake.pipes == [(n, BATCH, ["parser", "lemmatizer", "ner"]) for n in (64, 64, 2)] and fake.calls == 0
    per_title = spacy_noun_extractor("fake_model")  # the env's own extractor on the same pipeline
    products = load_catalog(tmp_path / "conv").products
    assert len(products) == N
    differs = 0
    for product in products.values():
        assert product.name_nouns == per_title(product.title) and product.name_nouns
        differs += product.name_nouns != heuristic_nouns(product.title)
    assert differs > 10  # the spaCy path, not the heuristic, made them (26 of 130 titles differ)


def test_auto_falls_back_to_the_heuristic_without_a_model(raw, tmp_path):
    stats = run(raw, tmp_path / "conv", nouns="auto", spacy_model="ragen_no_such_model", chunk_size=CHUNK,
                limit=40, progress=False)  # no such model (or no spaCy at all)
    assert stats.noun_extractor == "heuristic"
    assert json.loads((tmp_path / "conv" / "catalog.json").read_text())["noun_extractor"] == "heuristic"
    for product in load_catalog(tmp_path / "conv").products.values():
        assert product.name_nouns == heuristic_nouns(product.title)
    with pytest.raises(ValueError, match="--nouns spacy needs spaCy and model 'ragen_no_such_model'"):
        run(raw, tmp_path / "conv2", nouns="spacy", spacy_model="ragen_no_such_model", progress=False)


def test_progress_bars_go_to_stderr(raw, tmp_path, capsys):
    run(raw, tmp_path / "conv", nouns="heuristic", limit=10, progress=True)
    err = capsys.readouterr().err
    size = raw["items_shuffle"].stat().st_size
    assert re.search(r"attributes: 100%\|", err) and re.search(r"products: +\d+%\|", err), err
    assert "BM25 pass 2/2: write: 100%" in err
    assert f"/{tqdm.format_sizeof(size)} [" in err  # the products bar's total: the file's bytes
