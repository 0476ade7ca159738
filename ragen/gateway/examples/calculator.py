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


def run(base_url: str, api_key: str, task: dict | None, seed: int) -> float:
    """One episode: the question, tool calls answered, the final answer scored (module docstring)."""
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
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": calculate(expression)})
        if calls:
            continue
        answer = final_number(message.get("content"))
        if answer is not None:
            return float(answer == task["answer"])
        messages.append({"role": "user", "content": "Answer with the number alone."})
    return 0.0
