"""One real rollout of the default model through the hf engine on bandit and frozen_lake (2 envs, 2 turns).

Checks token-in/token-out end to end: the ids the engine sampled are the ids in the batch, at the model-token
positions, and a teacher-forced forward pass over the batch rows reproduces the engine's log-probs.
"""

from __future__ import annotations

import pytest
import torch
from agent_helpers import Recorder

from ragen.agent import AgentConfig, AgentProxy, ChatFormat, EnvGroupSpec
from ragen.models import load_model, load_tokenizer
from ragen.rollout import make_engine


@pytest.fixture(scope="module")
def model_and_tok():
    # One thread: on a shared 2-core box, intra-op threads oversubscribed by other processes run ~10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = load_tokenizer()
    model = load_model()
    model.eval()
    yield model, tok
    torch.set_num_threads(threads)


def test_chat_format_of_default_tokenizer(model_and_tok):
    _, tok = model_and_tok
    fmt = ChatFormat(tok)
    assert fmt.eot_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(fmt.separator_ids) == "\n"
    assert tok.decode(fmt.next_message("hello")) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("env_name", ["bandit", "frozen_lake"])
def test_real_rollout_ids_and_log_probs(model_and_tok, env_name):
    model, tok = model_and_tok
    engine = Recorder(make_engine("hf", model=model, tokenizer=tok))
    cfg = AgentConfig(max_turn=2, max_new_tokens=32, temperature=1.0)
    proxy = AgentProxy(engine, tok, cfg, [EnvGroupSpec(env_name, {}, n_groups=1, group_size=2)], [], seed=3)
    batch = proxy.rollout("train")
    assert batch.batch_size == 2 and not batch.failed.any()
    assert batch.input_ids.dtype == torch.long and batch.group_ids.tolist() == [0, 0]
    # The sampled ids sit exactly at the model-token positions of their turn, right after the engine's prompt.
    for k, (prompts, samples) in enumerate(engine.calls):
        active = [row for row in range(2) if int(batch.num_turns[row]) > k]  # generated for at call k, in order
        for row, prompt, sample in zip(active, prompts, samples, strict=True):
            n, m = len(prompt), len(sample.token_ids)
            assert batch.input_ids[row, :n].tolist() == prompt
            assert batch.input_ids[row, n : n + m].tolist() == sample.token_ids
            assert batch.response_mask[row, n : n + m].all()
            assert torch.allclose(batch.sample_log_probs[row, n : n + m], torch.tensor(sample.log_probs))
    assert int(batch.response_mask.sum()) == sum(len(s.token_ids) for _, ss in engine.calls for s in ss)
    # Teacher-forced log-probs of the batch rows match the engine's (fp32).
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / cfg.temperature, -1)
    logp = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.response_mask[:, 1:].bool()
    diff = (logp[mask] - batch.sample_log_probs[:, 1:][mask]).abs().max()
    assert diff < 1e-3, f"max |recomputed - engine| log-prob = {diff}"
    assert batch.metrics[f"env/{env_name}/turns"] >= 1.0
    assert batch.metrics["agent/generate_calls"] == len(engine.calls)
