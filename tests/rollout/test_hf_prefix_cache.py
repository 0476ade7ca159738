"""HFEngine's prefix cache (``ragen.rollout.hf_prefix``): a next-turn prompt that extends a sequence of the last call
prefills only its new tokens, and what it samples is what a full prefill gives."""

import pytest
import torch

from ragen.env import StepResult, register
from ragen.models import tiny_model
from ragen.rollout import SamplingParams
from ragen.rollout.hf import HFEngine, sampling_log_probs

TURN1 = [[1, 2000, 300, 45, 9], [7, 8], [1, 11, 12, 13, 14, 15, 16, 17, 18]]
OBS = [[50, 51, 52], [60], [70, 71, 72, 73, 74, 75, 76]]  # the next observation of each episode


def engines(tokenizer, **kw):
    model = tiny_model(tokenizer=tokenizer, seed=0)
    return HFEngine(model, tokenizer, prefix_cache=True, **kw), HFEngine(model, tokenizer, **kw)


def teacher_forced(model, prompt, ids, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return sampling_log_probs(logits, temperature).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def next_prompts(samples):
    return [p + s.token_ids + o for p, s, o in zip(TURN1, samples, OBS, strict=True)]


@pytest.mark.parametrize("batch_size", [4, 2])
def test_second_turn_reuses_the_cache_and_matches_a_full_prefill(default_tokenizer, batch_size):
    cached, plain = engines(default_tokenizer, batch_size=batch_size)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    first = cached.generate(TURN1, greedy)
    assert [s.token_ids for s in first] == [s.token_ids for s in plain.generate(TURN1, greedy)]
    stored = {tuple(ids) for ids, _ in cached.prefix_store.fresh}  # prompt + all sampled tokens but the last
    assert stored == {tuple(p + s.token_ids[:-1]) for p, s in zip(TURN1, first, strict=True)}
    turn2 = next_prompts(first)
    again = cached.generate(turn2, greedy)
    assert cached.prefix_store.hits == 3
    assert cached.prefix_store.reused_tokens == sum(len(p) + len(s.token_ids) - 1 for p, s in zip(TURN1, first,
                                                                                                   strict=True))
    full = plain.generate(turn2, greedy)
    assert [s.token_ids for s in again] == [s.token_ids for s in full]
    for a, b in zip(again, full, strict=True):
        torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4, rtol=0)


def test_sampled_log_probs_on_a_cached_prefix_are_exact_and_misses_mix_in(default_tokenizer):
    cached, _ = engines(default_tokenizer)
    first = cached.generate(TURN1, SamplingParams(temperature=1.0, max_new_tokens=4, seed=1))
    fresh = [400, 401, 402]  # no stored prefix: prefilled from scratch in the same batch
    prompts = [*next_prompts(first), fresh]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
    out = cached.generate(prompts, sampling)
    assert cached.prefix_store.hits == 3
    for prompt, sample in zip(prompts, out, strict=True):
        ref = teacher_forced(cached.model, prompt, sample.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(sample.log_probs), ref, atol=1e-4, rtol=0)


def test_new_weights_and_unrelated_prompts_do_not_reuse(default_tokenizer):
    cached, _ = engines(default_tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=3)
    first = cached.generate(TURN1, greedy)
    cached.update_weights({"lm_head.weight": cached.model.lm_head.weight.detach() * 1.5})
    cached.generate(next_prompts(first), greedy)
    assert cached.prefix_store.hits == 0  # the keys and values of the old weights are gone
    cached.generate([[5, 6, 7]], greedy)  # only the last call's sequences are kept, and these do not extend them
    assert cached.prefix_store.hits == 0 and cached.prefix_store.entries == []


def test_a_call_drops_the_sequences_it_does_not_extend_and_retain_keeps_the_played_ones(default_tokenizer):
    cached, plain = engines(default_tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    first = cached.generate(TURN1, greedy)
    turn2 = next_prompts(first)[:2]  # the third episode ended: its cache is dropped before this call's prefill
    again = cached.generate(turn2, greedy)
    assert cached.prefix_store.hits == 2
    kept = sorted(ids for ids, _ in cached.prefix_store.entries)  # saved in the order rows left the batch
    assert kept == sorted(p + s.token_ids[:-1] for p, s in zip(TURN1[:2], first[:2], strict=True))
    assert [s.token_ids for s in again] == [s.token_ids for s in plain.generate(turn2, greedy)]
    saved = [ids for ids, _ in cached.prefix_store.fresh]
    assert len(saved) == 2
    cached.retain_prefixes([turn2[1] + again[1].token_ids + [99]])  # only the second one will be continued
    assert [ids for ids, _ in cached.prefix_store.fresh] == [turn2[1] + again[1].token_ids[:-1]]
    plain.retain_prefixes([[1]])  # without a prefix cache: nothing to keep, no error


def test_a_paused_cache_neither_keeps_nor_uses_and_the_kept_caches_survive_the_pause(default_tokenizer):
    cached, plain = engines(default_tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    first = cached.generate(TURN1, greedy)
    store = cached.prefix_store
    with cached.prefix_cache_paused():
        one_off = cached.generate(next_prompts(first), greedy)  # would hit all 3 unpaused
    assert store.hits == 0 and len(store.fresh) == 3 and cached.prefix_store is store
    assert [s.token_ids for s in one_off] == [s.token_ids for s in plain.generate(next_prompts(first), greedy)]
    cached.generate(next_prompts(first), greedy)
    assert store.hits == 3


def test_trainer_turns_the_cache_on_for_multi_turn_envs_only(tmp_path, default_tokenizer):
    from ragen.trainer.builders import build_engine
    from ragen.trainer.config.compose import load_train_config

    model_dir = tmp_path / "tiny"
    tiny_model(tokenizer=default_tokenizer, seed=0).save_pretrained(model_dir)
    default_tokenizer.save_pretrained(model_dir)
    for config, on in (("ppo_bandit", False), ("ppo_multi_turn", True)):
        cfg = load_train_config(config, [f"trainer.output_dir={tmp_path}", "rollout.dtype=float32"])
        engine = build_engine(cfg, str(model_dir), default_tokenizer)
        assert (engine.prefix_store is not None) is on


@register("prefix_cache_walk")
class Walk:
    """Two-turn episodes whatever the answer (the observation does not depend on it)."""

    instructions = "Walk."

    def reset(self, seed: int) -> str:
        return "at 0"

    def legal_actions(self) -> str:
        return "left, right"

    def step(self, action: str) -> StepResult:
        return StepResult("at 1", 0.0, False, {"action_is_valid": True})


@pytest.mark.parametrize("history_thinking", ["keep", "strip"])
def test_stripped_prompts_never_reuse_an_unstripped_prefix(default_tokenizer, history_thinking):
    """``agent.history_thinking=strip``: the next turn's prompt leaves out the think block the last call ran (here the
    forced response prefix), so no stored sequence, which holds that block, is a prefix of it: nothing is reused, and
    the second turn samples exactly what an engine without the cache samples. With ``keep`` every episode reuses its
    first turn."""
    from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec

    cfg = AgentConfig(max_turn=2, max_new_tokens=6, layout="turn", history_thinking=history_thinking,
                      response_prefix="<think>plan</think>\n")
    runs = []
    for engine in engines(default_tokenizer):
        proxy = AgentProxy(engine, default_tokenizer, cfg, [EnvGroupSpec("prefix_cache_walk", {}, 1, 3)], [], seed=3)
        batch = proxy.rollout("train")
        runs.append((engine, batch))
    (cached, with_cache), (_, without) = runs
    assert with_cache.batch_size == 6  # three episodes of two turns
    if history_thinking == "strip":
        assert with_cache.metrics["agent/think_stripped_tokens"] > 0
        assert cached.prefix_store.hits == 0
        assert torch.equal(with_cache.input_ids, without.input_ids)
        assert torch.equal(with_cache.sample_log_probs, without.sample_log_probs)
    else:
        assert cached.prefix_store.hits == 3
