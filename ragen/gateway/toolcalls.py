"""Tool-call parsers: a model's completion text -> OpenAI ``tool_calls``, in the format of its model family.

Each family writes tool calls its own way; a parser is looked up once by the format's name (:func:`tool_parser`,
:data:`TOOL_PARSERS`), or from a model's name (:func:`parser_name_for_model`):

* ``hermes`` (Hermes, Qwen2.5, Qwen3): one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks in a message; the text outside the blocks is the message's content.
* ``none``: no tool calls; the whole text is the content.

A parser never raises, whatever the text (a model's output is not trusted input): a text it cannot read as tool
calls comes back as a :class:`ToolCallParse` with ``malformed`` set, the raw text as content, no tool calls and the
reason in ``error``, so the caller answers with a well-formed message (and may give a format penalty) instead of
failing the episode. A parse with one malformed block keeps none of the others: executing some calls of a message
and silently dropping one would hide the model's mistake from the program.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    """One parsed call, in the OpenAI shape: ``arguments`` is a JSON object serialised as a string (ASCII-escaped,
    so any text it holds survives any transport)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The ``tool_calls`` entry of an OpenAI chat message."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallParse:
    """What a parser read from one completion: the content (text outside the calls; the raw text when malformed),
    the calls in order, whether the text was malformed (and why, ``error``), and the raw text itself."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: bool = False
    raw: str = ""
    error: str = ""

    def openai_tool_calls(self) -> list[dict[str, Any]]:
        return [c.to_openai() for c in self.tool_calls]


def call_id(seed: str, index: int) -> str:
    """A stable id for the ``index``-th call of the completion named ``seed`` (e.g. request id and sample index):
    the same completion always gets the same ids, so a retried request answers with identical ids."""
    return "call_" + hashlib.sha256(f"{seed}:{index}".encode("utf-8", "surrogatepass")).hexdigest()[:24]


class ToolParser(Protocol):
    """Reads one completion's text; never raises (module docstring)."""

    name: str

    def parse(self, text: str, seed: str = "") -> ToolCallParse: ...


def _malformed(text: str, error: str) -> ToolCallParse:
    return ToolCallParse(content=text, malformed=True, raw=text, error=error)


class NoToolParser:
    """The ``none`` format: the text is all content."""

    name = "none"

    def parse(self, text: str, seed: str = "") -> ToolCallParse:
        text = text if isinstance(text, str) else ""
        return ToolCallParse(content=text, raw=text)


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class HermesParser:
    """The ``hermes`` format: ``<tool_call>{"name": str, "arguments": object}</tool_call>`` blocks; ``arguments``
    may be left out (no arguments). Anything else inside a block, an opening tag without its closing tag (a
    completion cut by the token budget) or a closing tag without its opening one is malformed."""

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str, seed: str = "") -> ToolCallParse:
        if not isinstance(text, str):
            return _malformed("", f"completion is {type(text).__name__}, not text")
        try:
            return self._parse(text, seed)
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises"; _parse is written not to
            return _malformed(text, f"{type(exc).__name__}: {exc}")

    def _parse(self, text: str, seed: str) -> ToolCallParse:
        calls: list[ToolCall] = []
        outside: list[str] = []
        end = 0
        for i, m in enumerate(_HERMES_BLOCK.finditer(text)):
            outside.append(text[end:m.start()])
            end = m.end()
            call, error = self._call(m.group(1), call_id(seed, i))
            if call is None:
                return _malformed(text, f"tool call {i}: {error}")
            calls.append(call)
        outside.append(text[end:])
        for piece in outside:
            if self.open_tag in piece:
                return _malformed(text, f"{self.open_tag} without {self.close_tag}")
            if self.close_tag in piece:
                return _malformed(text, f"{self.close_tag} without {self.open_tag}")
        content = "".join(outside).strip() if calls else text
        return ToolCallParse(content=content, tool_calls=tuple(calls), raw=text)

    @staticmethod
    def _call(body: str, cid: str) -> tuple[ToolCall | None, str]:
        """One block's call, or (None, why it is malformed)."""
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return None, f"invalid JSON ({type(exc).__name__})"
        if not isinstance(obj, dict):
            return None, f"a JSON {type(obj).__name__}, not an object"
        name, args = obj.get("name"), obj.get("arguments", {})
        if not isinstance(name, str) or not name:
            return None, "no function name"
        if not isinstance(args, dict):
            return None, f"arguments are a JSON {type(args).__name__}, not an object"
        try:
            encoded = json.dumps(args, ensure_ascii=True, allow_nan=False)
        except (ValueError, RecursionError) as exc:
            return None, f"arguments cannot be serialised ({type(exc).__name__})"
        return ToolCall(id=cid, name=name, arguments=encoded), ""


TOOL_PARSERS: dict[str, ToolParser] = {p.name: p for p in (HermesParser(), NoToolParser())}

# Model-name fragments (lower case) -> the format their family writes tool calls in; first match wins.
_FAMILIES: tuple[tuple[str, str], ...] = (("qwen", "hermes"), ("hermes", "hermes"))


def tool_parser(name: str) -> ToolParser:
    """The parser of the format ``name``; a ValueError names the formats there are."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; use one of {sorted(TOOL_PARSERS)}") from None


def parser_name_for_model(model: str) -> str:
    """The tool-call format of the family of the model named ``model`` (``none`` for a family without one)."""
    low = model.lower()
    return next((fmt for frag, fmt in _FAMILIES if frag in low), "none")
