"""Real chat templates: which calls of a tool-using conversation merge into one row (docs/gateway.md).

The default model's tokenizer plays a four-call conversation (system, user, assistant with the exact text the
gateway answered, tool results) under three templates: the default model's own, a Qwen2.5-style ChatML template
that renders tools and tool calls, and the same template stripping ``<think>...</think>`` from earlier assistant
turns. The "model" samples each token of its text one character at a time (ids a tokenizer would not produce
itself), so a merge also shows that the prompt reuses the sampled ids rather than tokenising the text again.
"""

import copy
import json

import pytest

from ragen.gateway.episodes import EpisodeLog
from ragen.gateway.render import PromptRenderer, normalise_messages
from ragen.gateway.toolcalls import tool_parser
from ragen.rollout.base import Sample

# A ChatML template in the style of Qwen2.5: a tools block in the system message, tool calls written as
# <tool_call> JSON blocks after the content, tool results as <tool_response> blocks in a user turn.
QWEN_STYLE = r"""
{%- set sys = messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' -%}
{{- '<|im_start|>system\n' + sys -}}
{%- if tools -%}
  {{- '\n\n# Tools\n\nFunction signatures:\n<tools>' -}}
  {%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\nCall one as <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}
    {{- '<|im_start|>user\n' + m.content + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set text = m.content -%}
    {%- if strip_thinking is defined and '</think>' in text -%}
      {%- set text = text.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' + text -}}
    {%- for c in m.tool_calls or [] -%}
      {%- if text or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name": "' + c.function.name + '", "arguments": ' + (c.function.arguments | tojson)
          + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
QWEN_STYLE_STRIP = "{%- set strip_thinking = true -%}" + QWEN_STYLE

CALC = {"name": "calc", "description": "evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}
TOOLS = [{"type": "function", "function": CALC}]


def call_text(expr: str, compact: bool = False) -> str:
    """A Hermes tool call as the model writes it: JSON with spaces (as the template's ``tojson``) or compact."""
    call = {"name": "calc", "arguments": {"expr": expr}}
    return "<tool_call>\n" + json.dumps(call, separators=(",", ":") if compact else None) + "\n</tool_call>"


def model_turns(think: bool, compact: bool = False) -> list[str]:
    """What the model writes on each of the four calls."""
    t = (lambda s: f"<think>{s}</think>\n") if think else (lambda s: "")
    return [t("I should use the tool.") + call_text("17*23", compact),
            t("The tool said 391.") + "17*23 = 391.",
            t("Add nine.") + call_text("391+9", compact),
            t("Done.") + "391+9 = 400."]


class CharSampler:
    """Samples the scripted texts one character per token, ending with the template's end-of-turn token."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.calls = tokenizer, texts, 0
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def sample(self) -> Sample:
        ids = [i for ch in self.texts[self.calls] for i in self.tokenizer(ch, add_special_tokens=False)["input_ids"]]
        ids.append(self.eot)
        self.calls += 1
        return Sample(ids, [-0.1 - 0.001 * j for j in range(len(ids))], "stop")


def play(tokenizer, texts: list[str], parser: str = "hermes", splice: bool = True) -> EpisodeLog:
    """system, user, then four calls; each answer goes back into the history as the gateway answered it, each tool
    call is answered by a tool message, and after the first answer the user asks a follow-up."""
    sampler = CharSampler(tokenizer, texts)
    renderer = PromptRenderer(tokenizer, stop_ids=[sampler.eot])
    log = EpisodeLog("ep")
    messages = [{"role": "system", "content": "You are a calculator agent."},
                {"role": "user", "content": "What is 17*23?"}]
    for k in range(len(texts)):
        prompt = log.prepare(renderer, normalise_messages(messages), TOOLS)
        if not splice:
            prompt.ids = renderer.encode(prompt.text)
        (rec,) = log.record(renderer, tool_parser(parser), f"req{k}", prompt, [sampler.sample()])
        message = renderer.message(rec.tool_parse)
        messages.append(message)
        for c in message.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "content": str(eval(json.loads(c["function"]["arguments"])["expr"]))})
        if k == 1:
            messages.append({"role": "user", "content": "And plus nine?"})
    return log


@pytest.fixture(scope="module")
def tokenizers(default_tokenizer):
    out = {"default": default_tokenizer}
    for name, template in (("qwen_style", QWEN_STYLE), ("qwen_style_strip", QWEN_STYLE_STRIP)):
        tok = copy.deepcopy(default_tokenizer)
        tok.chat_template = template
        out[name] = tok
    return out


def summary(log: EpisodeLog) -> tuple[int, list[tuple[str, str]]]:
    rows = log.rows()
    return rows.merged, [(f.reason, f.where) for f in rows.forks]


@pytest.mark.parametrize("template", ["default", "qwen_style"])
@pytest.mark.parametrize("think", [False, True])
def test_templates_that_do_not_rerender_merge_every_call(tokenizers, template, think):
    log = play(tokenizers[template], model_turns(think))
    assert summary(log) == (3, [])
    (row,) = log.rows().rows
    assert sum(row.model_mask) == sum(len(c.sampled_ids) for c in log.calls)
    assert [c.tool_parse.malformed for c in log.calls] == [False] * 4
    assert [len(c.tool_parse.tool_calls) for c in log.calls] == [1, 0, 1, 0]


def test_default_template_keeps_the_tool_call_text_in_the_message(tokenizers):
    """The default template does not render tool_calls: the message's content keeps the call's text."""
    renderer = PromptRenderer(tokenizers["default"])
    assert not renderer.tool_calls_rendered and PromptRenderer(tokenizers["qwen_style"]).tool_calls_rendered
    log = play(tokenizers["default"], model_turns(False))
    assert renderer.message(log.calls[0].tool_parse)["content"] == call_text("17*23")
    assert PromptRenderer(tokenizers["qwen_style"]).message(log.calls[0].tool_parse)["content"] is None


def test_stripped_thinking_forks_in_the_completion(tokenizers):
    log = play(tokenizers["qwen_style_strip"], model_turns(True))
    assert summary(log) == (0, [("prefix_mismatch", "completion")] * 3)
    without_thinking = play(tokenizers["qwen_style_strip"], model_turns(False))
    assert summary(without_thinking) == (3, [])  # nothing to strip: nothing re-rendered


def test_reserialised_tool_calls_fork(tokenizers):
    """A model that writes compact JSON gets its calls written back with spaces by a template that renders tool
    calls: the history is re-rendered, the call after each tool call forks; the default template merges."""
    log = play(tokenizers["qwen_style"], model_turns(False, compact=True))
    assert summary(log) == (1, [("prefix_mismatch", "completion")] * 2)
    assert summary(play(tokenizers["default"], model_turns(False, compact=True))) == (3, [])


def test_retokenising_instead_of_reusing_sampled_ids_would_fork(tokenizers):
    """Without reusing the tips' ids, tokenising the history again differs from the character-wise samples."""
    log = play(tokenizers["default"], model_turns(False), splice=False)
    merged, forks = summary(log)
    assert merged == 0 and len(forks) == 3 and {f[0] for f in forks} == {"prefix_mismatch"}
