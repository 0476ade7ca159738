"""Type checks of config values against the schema's field annotations (``ragen.trainer.config.schema``): a value of the
wrong type is reported by key (``trainer.total_steps='abc' has the wrong type: expected int``) before any section's
own checks run; YAML ints are turned into floats where a field is a float."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any


def _matches(value: Any, annotation: str) -> bool:
    """True when ``value`` (plain YAML data) fits one alternative of a field annotation such as ``int | None``,
    ``float``, ``list[str]``, ``tuple[float, float]`` or ``dict[str, Any]`` (floats must be finite; an int is a
    valid float; a bool is never a number)."""
    for alt in _split_top(annotation, "|"):
        if alt == "None" and value is None or alt == "Any":
            return True
        if alt == "bool" and isinstance(value, bool):
            return True
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if alt == "int" and number and isinstance(value, int):
            return True
        if alt == "float" and number and math.isfinite(value):
            return True
        if alt == "str" and isinstance(value, str):
            return True
        if alt.startswith("dict[") and isinstance(value, dict):
            return True
        if alt.startswith(("list[", "tuple[")) and isinstance(value, list | tuple):
            inner = _split_top(alt[alt.index("[") + 1:-1], ",")
            if alt.startswith("tuple[") and len(inner) != len(value):
                continue
            kinds = inner if alt.startswith("tuple[") else inner * len(value)
            if all(_matches(v, t) for v, t in zip(value, kinds, strict=False)):
                return True
    return False


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at the ``sep`` characters outside brackets, stripped: ``"dict[str, Any], int"`` ->
    ``["dict[str, Any]", "int"]``."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*parts, cur.strip()]


def type_problems(name: str, cls: type, values: dict[str, Any], nested: dict[str, type]) -> dict[str, str]:
    """``{key: message}`` for the values of section ``name`` whose type does not match the field (e.g.
    ``trainer.total_steps='abc'``), so they are reported by key instead of failing deep inside a check.
    ``nested``: the nested sections' dataclasses by annotation name (``rollout.vllm``: ``VLLMSection``), whose
    mappings are checked key by key."""
    types = {f.name: str(f.type) for f in fields(cls)}
    out = {}
    for key, value in values.items():
        inner_cls = nested.get(types.get(key, ""))
        if inner_cls is not None and isinstance(value, dict):  # e.g. rollout.vllm: check its own keys
            valid = {f.name for f in fields(inner_cls)}
            inner = type_problems(f"{name}.{key}", inner_cls, {k: v for k, v in value.items() if k in valid}, nested)
            if inner:
                out[key] = "; ".join(inner.values())
            continue
        if key in types and not _matches(value, types[key]):
            example = _EXAMPLES.get(types[key].split("|")[0].strip().split("[")[0], "")
            out[key] = (f"{name}.{key}={value!r} has the wrong type: expected {types[key]}"
                        f"{f' (e.g. {name}.{key}={example})' if example else ''}")
    return out


_EXAMPLES = {"int": "4", "float": "0.5", "bool": "true", "str": "text", "list": "[a,b]", "tuple": "[0.9,0.999]",
             "dict": "{}"}


def coerce(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """YAML writes ``0`` for a float field: turn ints into floats where the field is annotated ``float``."""
    types = {f.name: str(f.type) for f in fields(cls)}
    out = dict(values)
    for key, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool) and types[key].startswith("float"):
            out[key] = float(value)
    return out
