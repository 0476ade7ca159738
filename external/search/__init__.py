"""A disk-backed BM25 index over a Wikipedia-style dump for the ``search_qa`` env (see README.md).

``python -m ragen_external.search.build --corpus dump.jsonl --out INDEX_DIR`` builds it; the env reads it with
``env.config.index_path=INDEX_DIR``."""
