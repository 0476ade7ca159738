"""Expert rollouts through the agent proxy (ragen.agent.expert): the warm start imitates exactly the tokens and
masks RL samples and trains on."""

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.agent.expert import ExpertResponder


def proxy_with(engine, tok, cfg, n_groups=2, group_size=2):
    return AgentProxy(engine, tok, cfg, [EnvGroupSpec("test_line", {}, n_groups, group_size)], [], seed=3)


@pytest.mark.parametrize(("think", "prefix", "stop_at_answer"),
                         [(False, "<answer>", True), (False, "", False), (True, "", True)])
def test_expert_batch_equals_the_rl_batch_of_the_same_tokens(char_tok, fake_engine, think, prefix, stop_at_answer):
    """The SFT mask is the RL response mask: an expert rollout and a model that samples exactly the expert's
    tokens give the same batch (ids, response mask, turn ids, rewards); env, prompt, forced-prefix and padding
    tokens are outside the mask."""
    cfg = AgentConfig(max_turn=3, think=think, response_prefix=prefix, stop_at_answer=stop_at_answer)
    eot = char_tok.convert_tokens_to_ids("<|end|>")
    responder = ExpertResponder(char_tok, cfg, eot)
    expert = proxy_with(fake_engine(lambda *a: []), char_tok, cfg).rollout("train", responder=responder)
    text = responder.text("right")
    full = ("<think></think>" if think else "") + "<answer>right</answer>"
    assert text == full[len(prefix):]
    sampled_ids = char_tok(text, add_special_tokens=False)["input_ids"] + ([] if stop_at_answer else [eot])
    model = proxy_with(fake_engine(lambda call, i, prompt: sampled_ids, decode=char_tok.decode), char_tok, cfg)
    rl = model.rollout("train")
    for name in ("input_ids", "attention_mask", "response_mask", "turn_ids", "token_rewards"):
        assert torch.equal(getattr(expert, name), getattr(rl, name)), name
    assert expert.turn_rewards.tolist() == [[1.0, 0.0, 2.0]] * 4  # the expert walked right 3 times: success
    assert expert.metrics["env/test_line/success"] == 1.0 and expert.metrics["env/test_line/format_ok"] == 1.0
    row, mask = expert.input_ids[0].tolist(), expert.response_mask[0].tolist()
    imitated = char_tok.decode([t for t, m in zip(row, mask, strict=True) if m])
    assert imitated == (text + ("" if stop_at_answer else "<|end|>")) * 3  # the model tokens of the 3 turns


def test_noise_takes_random_legal_actions_and_bad_settings_raise(char_tok, fake_engine):
    cfg = AgentConfig(max_turn=3, think=False)
    eot = char_tok.convert_tokens_to_ids("<|end|>")
    noisy = ExpertResponder(char_tok, cfg, eot, noise=1.0, seed=0)
    batch = proxy_with(fake_engine(lambda *a: []), char_tok, cfg, 4, 4).rollout("train", responder=noisy)
    actions = [a for ep in batch.episodes for turn in ep.turns for a in turn.actions]
    assert set(actions) == {"left", "right"} and noisy.stats["expert_turns"] == 0
    assert noisy.stats["noise_turns"] == len(actions) == 48
    assert actions.count("left") == actions.count("right") == 24  # dealt like cards: each legal action equally often
    with pytest.raises(ValueError, match="noise"):
        ExpertResponder(char_tok, cfg, eot, noise=1.5)
    with pytest.raises(ValueError, match="random_actions must be one of dealt, independent, got 'shuffled'"):
        ExpertResponder(char_tok, cfg, eot, noise=1.0, random_actions="shuffled")
    with pytest.raises(ValueError, match="response_prefix"):
        ExpertResponder(char_tok, AgentConfig(think=False, response_prefix="<think>"), eot).text("right")


def test_independent_random_actions_repeat_where_dealt_ones_alternate(char_tok, fake_engine):
    """``random_actions``: a dealt deck of two actions never holds three of a kind in a row (each pair of deals is
    one of each), uniform independent draws do (1 in 4 per triple); both only take legal actions."""
    cfg = AgentConfig(max_turn=3, think=False)
    eot = char_tok.convert_tokens_to_ids("<|end|>")

    def actions(kind):
        responder = ExpertResponder(char_tok, cfg, eot, noise=1.0, seed=1, random_actions=kind)
        return [responder.action(_TwoActions()) for _ in range(400)]

    def triples(seq):
        return sum(a == b == c for a, b, c in zip(seq, seq[1:], seq[2:], strict=False))

    dealt, independent = actions("dealt"), actions("independent")
    assert set(dealt) == set(independent) == {"left", "right"}
    assert dealt.count("left") == 200 and triples(dealt) == 0
    assert 60 < triples(independent) < 140  # 398 triples, each 1/4 under independent draws: 99.5 expected


class _TwoActions:
    def legal_actions(self):
        return "left, right"

    def action_list(self):
        return ["left", "right"]


class _FreeText:
    """An env whose actions are free text: ``legal_actions`` describes them (with commas), nothing lists them."""

    def legal_actions(self):
        return "Any yes/no question (e.g. 'Is it red?'), or a guess 'Is it a <object>?'. Questions left: 3."

    def expert_action(self):
        return "Is it an animal?"


def test_random_actions_come_from_the_action_list_never_from_the_description(char_tok):
    """Noise draws from ``action_list()``; an env without one (free text) gets its expert's action, never a
    fragment of the prose ``legal_actions()`` shows (config validation refuses noise there, ``check_warm_start``)."""
    cfg = AgentConfig(max_turn=3, think=False)
    eot = char_tok.convert_tokens_to_ids("<|end|>")
    responder = ExpertResponder(char_tok, cfg, eot, noise=1.0, seed=0)
    assert {responder.action(_FreeText()) for _ in range(20)} == {"Is it an animal?"}
    assert responder.stats == {"expert_turns": 20, "noise_turns": 0}
    assert {responder.action(_TwoActions()) for _ in range(20)} == {"left", "right"}
    assert responder.stats["noise_turns"] == 20


def test_several_actions_per_turn_are_planned_on_a_copy(char_tok, fake_engine):
    """With max_actions_per_turn > 1 the expert answers a plan (read off a copy of the env), ending where the
    copy's episode ends; the real env only moves when the proxy executes the answer."""
    cfg = AgentConfig(max_turn=3, think=False)
    eot = char_tok.convert_tokens_to_ids("<|end|>")
    responder = ExpertResponder(char_tok, cfg, eot)
    spec = EnvGroupSpec("test_line", {"horizon": 3}, 1, 1, max_actions_per_turn=2)
    batch = AgentProxy(fake_engine(lambda *a: []), char_tok, cfg, [spec], []).rollout("train", responder=responder)
    turns = batch.episodes[0].turns
    assert [t.actions for t in turns] == [["right", "right"], ["right"]]  # the plan stops at the copy's done
    assert [t.response_text for t in turns] == ["<answer>right || right</answer>", "<answer>right</answer>"]
    assert batch.turn_rewards.tolist() == [[1.0, 2.0]] and batch.episodes[0].success
