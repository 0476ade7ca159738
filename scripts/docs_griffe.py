"""A griffe extension for the documentation build (``mkdocs.yml``, loaded by mkdocstrings).

The docstrings of ragen are plain text, not Markdown written for the site: an index such as ``keys[b][k]`` in one
would be read as a Markdown reference link to a target ``k`` and fail the strict build. This escapes the second
bracket of every ``][`` so it renders as written.
"""

from __future__ import annotations

from typing import Any

import griffe


class PlainDocstrings(griffe.Extension):
    """Escape ``][`` in every docstring (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = obj.docstring.value.replace("][", "]\\[")
