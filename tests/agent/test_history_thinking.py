"""``agent.history_thinking=strip``: each earlier turn's thinking is cut from later prompts by cutting its sampled ids
(``ragen.agent.thinking``, ``EpisodeContext``), so a prompt is exactly what a thinking-stripping chat template renders
for the conversation, token for token what the engine is fed and what the ``turn`` layout trains on."""

from __future__ import annotations

import pytest
from agent_helpers import Recorder

from ragen.agent.context import ChatFormat, EpisodeContext
from ragen.agent.thinking import think_cut

# The default tokenizer's template (SmolLM2, ChatML), rendering an assistant message as Qwen3's template renders the
# assistant turns before the last user message: everything through the last </think> and the newlines after it dropped.
STRIP_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def strip_tokenizer():
    """The default tokenizer with :data:`STRIP_TEMPLATE` as its chat template."""
    from ragen.models import load_tokenizer

    tok = load_tokenizer()
    tok.chat_template = STRIP_TEMPLATE
    return tok


def _ids(tok, *pieces: str) -> list[int]:
    """The ids of ``pieces`` each tokenised on its own and concatenated (how a model may segment a text)."""
    return [i for p in pieces for i in tok(p, add_special_tokens=False)["input_ids"]]


def _decode(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def test_cut_point_on_token_boundaries(default_tokenizer):
    tok, eot = default_tokenizer, default_tokenizer.eos_token_id
    msg = _ids(tok, "<think>go left</think>\n\n<answer>Left</answer>") + [eot]
    cut = think_cut(_decode(tok), msg, "</think>")
    assert tok.decode(msg[:cut]) == "<think>go left</think>\n\n"  # the tag and the newlines after it
    assert tok.decode(msg[cut:], skip_special_tokens=False) == "<answer>Left</answer><|im_end|>"
    # the tag spelled by other tokens than the tokenizer's own segmentation; text before it and an earlier block go too
    odd = _ids(tok, "Hm <think>a</think> b <think>c</th", "ink>", "\n<answer>Up</answer>")
    cut = think_cut(_decode(tok), odd, "</think>")
    assert tok.decode(odd[cut:]) == "<answer>Up</answer>"
    assert think_cut(_decode(tok), _ids(tok, "<think>unfinished reasoning"), "</think>") == 0
    assert think_cut(_decode(tok), _ids(tok, "<answer>Left</answer>"), "</think>") == 0
    # '</think><answer>' ends in the token '><': no boundary after the tag, the message is kept whole
    assert think_cut(_decode(tok), _ids(tok, "<think>x</think><answer>Left</answer>"), "</think>") is None
    assert think_cut(_decode(tok), _ids(tok, "<think>x</think>\nok"), "</think>") is not None
    assert think_cut(_decode(tok), _ids(tok, "<think>x</think>\n\nThe"), "</think>") is not None


def test_single_token_tags_always_cut_exactly():
    """Qwen3-style tokenizers hold the tags as single tokens, so '</think><answer>' has a boundary after the tag."""
    from ragen.models import load_tokenizer

    tok = load_tokenizer()
    tok.add_tokens(["<think>", "</think>"])
    msg = _ids(tok, "<think>x</think><answer>Left</answer>")
    assert tok.convert_tokens_to_ids("</think>") in msg
    cut = think_cut(_decode(tok), msg, "</think>")
    assert cut is not None and tok.decode(msg[cut:]) == "<answer>Left</answer>"


ALIGNED = ["<think>the goal is down</think>\n<answer>Down</answer>",
           "<think>one more</think>\n\n<answer>Right</answer>", "<answer>Left</answer>", "<think>stuck, no answer yet"]


def _conversation(instructions: str, users: list[str], contents: list[str]) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": f"{instructions}\n\n{users[0]}"}]
    for content, user in zip(contents, users[1:], strict=False):
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": user}]
    return messages


@pytest.mark.parametrize("prefix", ["", "<think>"])
@pytest.mark.parametrize("mode", ["keep", "strip"])
def test_prompts_are_the_template_rendering(default_tokenizer, strip_tokenizer, prefix, mode):
    """Every turn's prompt decodes to the conversation as rendered by the template that matches the mode (the
    default template for ``keep``, the stripping one for ``strip``) plus the forced prefix; a forced ``<think>`` is
    the start of the assistant message (the model writes the rest of the block)."""
    tok = strip_tokenizer if mode == "strip" else default_tokenizer
    fmt = ChatFormat(tok, response_prefix=prefix)
    ctx = EpisodeContext(fmt, "Rules.", strip_tag="</think>" if mode == "strip" else None)
    users, contents = ["obs 0"], []
    ctx.add_user(users[0])
    for k, text in enumerate(ALIGNED):
        text = text.removeprefix(prefix)
        plan = ctx.plan(None, 4096, 64)
        ctx.use_plan(plan)
        expected = tok.apply_chat_template(_conversation("Rules.", users, contents), tokenize=False,
                                           add_generation_prompt=True) + prefix
        assert tok.decode(plan.ids, skip_special_tokens=False) == expected, k
        ids = fmt.encode(text) + [fmt.eot_id]
        ctx.add_response(ids, [-0.1] * len(ids))
        contents.append(prefix + text)
        users.append(f"obs {k + 1}")
        ctx.add_user(users[-1])
    cuts = ctx.think_cuts
    if mode == "keep":
        assert cuts == [0, 0, 0, 0]
    else:  # the two closed blocks are cut (with the prefix's ids), the answer-only and unfinished turns are not
        assert cuts[0] > 0 and cuts[1] > 0 and cuts[2:] == [0, 0]
        assert len(ctx.view) == len(ctx.ids) - cuts[0] - cuts[1]


def test_unaligned_turn_is_kept_whole(default_tokenizer):
    fmt = ChatFormat(default_tokenizer)
    ctx = EpisodeContext(fmt, "Rules.", strip_tag="</think>")
    ctx.add_user("obs 0")
    ctx.use_plan(ctx.plan(None, 4096, 64))
    ids = fmt.encode("<think>x</think><answer>Left</answer>") + [fmt.eot_id]
    ctx.add_response(ids, [-0.1] * len(ids))
    ctx.add_user("obs 1")
    assert ctx.think_cuts == [None] and ctx.view == ctx.ids


def test_window_and_budget_cuts_apply_to_the_stripped_view(default_tokenizer):
    """History dropped by ``max_context_window`` restarts from a fresh first message, then the stripped view."""
    fmt = ChatFormat(default_tokenizer, response_prefix="<think>")
    ctx = EpisodeContext(fmt, "Rules.", strip_tag="</think>")
    ctx.add_user("obs 0")
    for k in range(2):
        ctx.use_plan(ctx.plan(None, 4096, 64))
        ids = fmt.encode(f"plan {k}</think>\n<answer>Down</answer>") + [fmt.eot_id]
        ctx.add_response(ids, [-0.1] * len(ids))
        ctx.add_user(f"obs {k + 1}")
    plan = ctx.plan(1, 4096, 64)  # keep only the last turn
    text = default_tokenizer.decode(plan.ids, skip_special_tokens=False)
    assert plan.start_turn == 1 and "plan 1" not in text and "plan 0" not in text
    assert text.startswith(default_tokenizer.decode(ctx.head(1)[:-len(fmt.prefix_ids)], skip_special_tokens=False))
    assert text.endswith("<|im_start|>assistant\n<answer>Down</answer><|im_end|>\n<|im_start|>user\nobs 2<|im_end|>\n"
                         "<|im_start|>assistant\n<think>")
    assert len(plan.ids) == ctx._prompt_len(1)


# ---------------------------------------------------------------------------------------------- through the proxy


def _proxy(engine, tok, cfg, env: str, n: int):  # noqa: ANN001, ANN202
    """An ``AgentProxy`` that keeps the episode contexts of its last rollout (``proxy.contexts``, slot order)."""
    from ragen.agent import AgentProxy, EnvGroupSpec

    class Keeping(AgentProxy):
        def _open(self, slot, described):  # noqa: ANN001, ANN202
            ctx = super()._open(slot, described)
            self.contexts.append(ctx)
            return ctx

    proxy = Keeping(engine, tok, cfg, [EnvGroupSpec(env, {}, n_groups=1, group_size=n)], [], seed=3)
    proxy.contexts = []
    return proxy


def _shown(content: str, cut: int | None) -> str:
    """An earlier assistant message as the stripping template renders it, or whole when the context kept it."""
    return content if cut is None or "</think>" not in content else content.split("</think>")[-1].lstrip("\n")


def check_rollout(batch, contexts, calls, tok, plain_template: str, prefix: str) -> int:  # noqa: ANN001
    """Every turn row is the prompt the engine was fed + the sampled ids (+ the appended end-of-turn token), and the
    prompt decodes to the conversation rendered by the stripping template (by the plain template with the stripped
    contents where a turn was kept whole); returns the number of turns checked."""
    fed = {}
    for k, (prompts, samples) in enumerate(calls):
        active = [e for e, ctx in enumerate(contexts) if ctx is not None and ctx.num_turns > k]
        fed.update({(e, k): (p, s) for e, p, s in zip(active, prompts, samples, strict=True)})
    eot = contexts[0].fmt.eot_id
    for r in range(batch.batch_size):
        e, k = int(batch.episode_index[r]), int(batch.turn_index[r])
        prompt, sample = fed[(e, k)]
        ctx = contexts[e]
        close = [] if sample.token_ids and sample.token_ids[-1] == eot else [eot]
        n = int(batch.attention_mask[r].sum())
        assert batch.input_ids[r, :n].tolist() == prompt + sample.token_ids + close  # trained = fed + sampled
        assert ctx.turn_prompts[k] == prompt
        contents = [prefix + tok.decode(ids[:-1] if ids and ids[-1] == eot else ids, skip_special_tokens=False)
                    for ids, _ in ctx.responses[:k]]
        cuts = ctx.think_cuts[:k]
        users = ctx.user_texts[: k + 1]
        text = tok.decode(prompt, skip_special_tokens=False)
        if None not in cuts:
            assert text == tok.apply_chat_template(_conversation(ctx.instructions, users, contents), tokenize=False,
                                                   add_generation_prompt=True) + prefix
        shown = [_shown(c, cut) for c, cut in zip(contents, cuts, strict=True)]
        assert text == tok.apply_chat_template(_conversation(ctx.instructions, users, shown), tokenize=False,
                                               add_generation_prompt=True, chat_template=plain_template) + prefix
    return batch.batch_size


SCRIPT = ["<think>walk right</think>\n<answer>right</answer>", "<think>x</think><answer>left</answer>",
          "<answer>right</answer>"]


def test_proxy_trains_on_exactly_the_stripped_prompts(default_tokenizer, strip_tokenizer, fake_engine):
    from ragen.agent import AgentConfig

    tok = strip_tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    engine = Recorder(fake_engine(lambda call, i, prompt: _ids(tok, SCRIPT[(call + i) % 3]) + [eot]))
    cfg = AgentConfig(max_turn=3, max_new_tokens=64, layout="turn", history_thinking="strip")
    proxy = _proxy(engine, tok, cfg, "test_line", 3)
    batch = proxy.rollout("train")
    assert check_rollout(batch, proxy.contexts, engine.calls, tok, default_tokenizer.chat_template, "") == 9
    cuts = [c for ctx in proxy.contexts for c in ctx.think_cuts]
    assert cuts.count(None) == 3 and sum(c > 0 for c in cuts if c is not None) == 3
    assert batch.metrics["agent/think_kept_unaligned"] == 3.0
    assert batch.metrics["agent/think_stripped_tokens"] == float(sum(c for c in cuts if c))
    assert batch.metrics["agent/prompt_tokens"] == float(sum(len(p) for ps, _ in engine.calls for p in ps))


def test_default_model_thinking_under_a_forced_prefix(default_tokenizer, strip_tokenizer):
    """The default model continues a forced ``<think>``; whatever it writes, the rows are the fed prompts and their
    text is the stripping template's rendering (seed 3: some turns close the block on a token boundary)."""
    import torch

    from ragen.agent import AgentConfig
    from ragen.models import load_model
    from ragen.rollout import make_engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = Recorder(make_engine("hf", model=load_model(), tokenizer=strip_tokenizer, prefix_cache=True))
        cfg = AgentConfig(max_turn=2, max_new_tokens=24, layout="turn", history_thinking="strip",
                          response_prefix="<think>")
        proxy = _proxy(engine, strip_tokenizer, cfg, "frozen_lake", 3)
        batch = proxy.rollout("train")
    finally:
        torch.set_num_threads(threads)
    check_rollout(batch, proxy.contexts, engine.calls, strip_tokenizer, default_tokenizer.chat_template, "<think>")
    assert batch.metrics["agent/think_stripped_tokens"] > 0
