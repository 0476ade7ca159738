"""A tool-using agent written against the OpenAI chat-completions API: arithmetic questions with a ``calculator``
tool; reward 1.0 when the final answer is right.

Train it with one config line (docs/gateway.md, "Training a program")::

    python -m ragen.train env=agent_program env.config.entry=ragen.gateway.examples.calculator:run

It uses only the standard library (``urllib`` and ``json``), so the JSON the API takes is in plain sight. The
``openai`` client does the same with ``OpenAI(base_url=base_url, api_key=api_key)`` and
``client.chat.completions.create(model="ragen", messages=..., tools=TOOLS)``: point it at ``base_url`` and it
trains as it is.

The task of a seed is drawn by :func:`make_task` when the run gives none (``env.config.tasks`` /
``tasks_entry`` unset). The program allows ``MAX_CALLS`` calls: a tool call is answered with the calculator's
result; an answer that is no number gets one reminder.

:func:`expert` writes the demonstrations of a warm start (``env.config.expert``; docs/gateway.md): a tool call with
the question's expression, then the tool's result as the answer. :func:`run_without_tool` is the same program whose
calculator is disabled (it answers every call with an error): the control of the learning check, where the right
answer is never in the prompt.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
import urllib.request
from typing import Any

MODEL = "ragen"  # the model name the endpoint serves (env.config.model)
MAX_CALLS = 3
TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]
DISABLED = "error: the calculator is disabled"
SYSTEM = ("You solve arithmetic questions. You may call the calculator tool. Answer with the number alone, "
          "e.g. 42.")


def make_task(seed: int) -> dict[str, Any]:
    """The question of ``seed``: ``a * b + c`` with its answer."""
    rng = random.Random(seed)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 999)
    return {"question": f"What is {a} * {b} + {c}?", "answer": a * b + c}


def chat(base_url: str, api_key: str, messages: list[dict], tools: list[dict] | None = None) -> dict:
    """One ``POST {base_url}/chat/completions``; the first choice's message."""
    body = {"model": MODEL, "messages": messages, **({"tools": tools} if tools else {})}
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())["choices"][0]["message"]


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, or an error text (never raises)."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        result = value(ast.parse(str(expression)[:200], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def final_number(text: str | None) -> float | None:
    """The last number in ``text``, or None."""
    found = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return float(found[-1]) if found else None


def run(base_url: str, api_key: str, task: dict | None, seed: int, tool: bool = True) -> float:
    """One episode: the question, tool calls answered (by the calculator when ``tool``, else with an error), the
    final answer scored (module docstring)."""
    task = task or make_task(seed)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    for _ in range(MAX_CALLS):
        message = chat(base_url, api_key, messages, TOOLS)
        messages.append(message)  # the answer goes back as it came, so the next prompt extends this one
        calls = message.get("tool_calls") or []
        for call in calls:
            try:
                expression = json.loads(call["function"]["arguments"]).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            result = calculate(expression) if tool else DISABLED
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        if calls:
            continue
        answer = final_number(message.get("content"))
        if answer is not None:
            return float(answer == task["answer"])
        messages.append({"role": "user", "content": "Answer with the number alone."})
    return 0.0


def run_without_tool(base_url: str, api_key: str, task: dict | None, seed: int) -> float:
    """:func:`run` with the calculator disabled (module docstring)."""
    return run(base_url, api_key, task, seed, tool=False)


def expert(prompt: str) -> str:
    """The demonstration for a call whose rendered prompt is ``prompt`` (a ChatML rendering, as the default model's
    and Qwen's templates write it): after a tool result, the answer (the result; when the result is no number, the
    question's value, computed here); otherwise a calculator call on the question's expression."""
    question = re.findall(r"What is ([^?]+)\?", prompt)
    expression = question[-1] if question else "0"
    blocks = prompt.split("<|im_start|>")
    last = blocks[-2] if len(blocks) >= 2 else ""  # the message before the generation prompt
    if last.startswith("tool") or "<tool_response>" in last:
        result = calculate(expression)
        shown = re.findall(r"-?\d+(?:\.\d+)?", last.split("\n", 1)[-1])
        return shown[-1] if shown else result
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"
