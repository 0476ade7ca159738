"""Chat messages -> prompt ids, keeping the ids the model sampled wherever the template renders them unchanged.

A program sends the whole conversation on every call; the gateway renders it with the tokenizer's chat template
(to text) and tokenises it. Tokenising the text of an earlier completion again need not give the ids the model
sampled (a tokenizer has many ways to spell a string, and a sampling model picks any of them), so the gateway
keeps, per episode, each answered call's *tip*: the rendered prompt text plus the completion's text (special tokens
kept, the stop token included) and the matching ids (the prompt ids plus the sampled ids). When a new rendering
starts with a tip's text, character for character, its ids are that tip's ids followed by the rest of the text
tokenised on its own (:meth:`PromptRenderer.prompt_ids`). The model then sees its own sampled ids again, and the
call merges with the previous one (``ragen.gateway.record``). When the template re-renders history (thinking
stripped, tool calls re-serialised, whitespace normalised), no tip's text is a prefix, the whole text is tokenised
afresh, and the merge rule reports the fork: nothing is spliced into text the template did not produce.

What a response's message holds (:meth:`PromptRenderer.message`): the completion's text without its final stop
token; with tool calls, the text outside them when the template renders tool calls itself (it writes them back
into later prompts), else the whole text, so that a template that does not know tool calls renders the call's text
back as the model wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ragen.gateway.toolcalls import ToolCallParse


class RequestError(ValueError):
    """A request the gateway cannot serve; its message is the OpenAI-style error's message (HTTP 400)."""

    def __init__(self, message: str, code: str = "invalid_request_error", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True)
class Tip:
    """One answered sample's rendered prompt text + completion text, and its prompt ids + sampled ids."""

    text: str
    ids: tuple[int, ...]


_PROBE = "ragen_probe_tool"


def renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes an assistant message's ``tool_calls`` into the prompt."""
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": _PROBE, "arguments": {}}}]}]
    try:
        return _PROBE in tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on tool calls does not render them
        return False


def _content(value: Any, where: str) -> str:
    """A message's content as text: a string, None (an assistant message with only tool calls) or a list of
    OpenAI text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    raise RequestError(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls with their ``arguments`` as JSON objects (templates serialise them)."""
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}.tool_calls[{j}] needs function.name", param=f"{where}.tool_calls")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # kept as the string the program sent
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def normalise_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's ``messages`` in the shape chat templates read (string contents, argument objects); a
    :class:`RequestError` says what is wrong with them."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise RequestError(f"{where} must be an object with a role", param=where)
        norm = {**msg, "content": _content(msg.get("content"), where)}
        if msg.get("tool_calls"):
            norm["tool_calls"] = _tool_calls(msg["tool_calls"], where)
        out.append(norm)
    return out


class PromptRenderer:
    """Renders requests with one tokenizer's chat template (module docstring). ``stop_ids``: the ids that end a
    sample (the template's end-of-turn token, eos), left out of a message's text."""

    def __init__(self, tokenizer: Any, stop_ids: Iterable[int] = ()) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat template; the gateway renders "
                             "chat messages with it (set tokenizer.chat_template)")
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.tool_calls_rendered = renders_tool_calls(tokenizer)

    def text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The template's rendering of ``messages`` (normalised) and ``tools``, with the generation prompt."""
        kwargs = {"tools": tools} if tools else {}
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem, answered with a 400
            raise RequestError(f"the chat template cannot render these messages: {exc}", param="messages") from None
        if not isinstance(text, str):
            raise RequestError("the chat template did not render text", param="messages")
        return text

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without added special tokens (the rendered text holds its own)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, text: str, tips: Sequence[Tip]) -> list[int]:
        """Ids of the rendered ``text``: the ids of the first tip (most recent first) whose text starts ``text``,
        then the rest tokenised; without one, ``text`` tokenised."""
        for tip in tips:
            if tip.text and text.startswith(tip.text):
                return list(tip.ids) + self.encode(text[len(tip.text):])
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (every sampled token shows)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def completion_text(self, ids: Sequence[int]) -> str:
        """A sample's text without its final stop token (what a message's content holds)."""
        ids = list(ids)
        return self.decode(ids[:-1] if ids and ids[-1] in self.stop_ids else ids)

    def tip(self, prompt_text: str, prompt_ids: Sequence[int], sampled_ids: Sequence[int]) -> Tip:
        """The tip of a sample (module docstring)."""
        return Tip(prompt_text + self.decode(sampled_ids), tuple(prompt_ids) + tuple(sampled_ids))

    def message(self, parse: ToolCallParse) -> dict[str, Any]:
        """The response's assistant message for a parsed sample (module docstring)."""
        if not parse.tool_calls:
            return {"role": "assistant", "content": parse.raw}
        content = parse.content if self.tool_calls_rendered else parse.raw
        return {"role": "assistant", "content": content or None, "tool_calls": parse.openai_tool_calls()}
