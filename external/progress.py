"""A file read with a progress bar over its bytes (shared by the WebShop converter and the search index build).

Streaming converters do not know how many records a multi-GB dump holds before reading it, but they know its
size: a tqdm bar over the bytes read gives the percentage and the ETA. ``progress_file`` yields a
``ProgressReader``: ``read`` (what ijson calls) and line iteration (a JSONL dump) both advance the bar.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm


class ProgressReader:
    """A binary file whose reads advance ``bar`` by the bytes read."""

    def __init__(self, f: BinaryIO, bar: tqdm):
        self.f, self.bar = f, bar

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.bar.update(len(data))
        return data

    def __iter__(self) -> Iterator[bytes]:
        for line in self.f:
            self.bar.update(len(line))
            yield line


@contextlib.contextmanager
def progress_file(path: Path, desc: str, enabled: bool) -> Iterator[ProgressReader]:
    """``path`` opened for binary reading, with a progress bar (total: the file's size) over the bytes read."""
    with path.open("rb") as raw, tqdm(total=path.stat().st_size, desc=desc, unit="B", unit_scale=True,
                                      disable=not enabled) as bar:
        yield ProgressReader(raw, bar)
