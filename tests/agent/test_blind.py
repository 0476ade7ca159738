"""``agent.observations=blind``: the observation-blind control of learning claims. Every observation becomes a
constant filler of the same token count, so prompts keep their length and structure but hide the state."""

from __future__ import annotations

import pytest

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.agent.blind import blind_text
from ragen.env import make


def _n(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("text", ["pos=0", "pos=10", "P_O\n___\n__G", "Yes.", "", "a much longer observation, 42!"])
def test_filler_has_the_observations_token_count_on_a_char_tokenizer(char_tok, text):
    blind = blind_text(text, char_tok)
    assert _n(char_tok, blind) == _n(char_tok, text)
    assert set(blind) <= set("blank .")


def test_filler_matches_real_observations_on_the_default_tokenizer():
    from ragen.models import load_tokenizer

    tok = load_tokenizer()
    observations = [make("frozen_lake", size=3).reset(s) for s in range(4)] + [make("sokoban").reset(0)]
    observations += ["Yes.", "No.", "The secret is not an animal."]
    for obs in observations:
        blind = blind_text(obs, tok)
        assert _n(tok, blind) == _n(tok, obs) > 0
        assert set(blind.split()) == {"blank"}  # words alone match on a BPE vocabulary
    by_length: dict[int, set[str]] = {}
    for obs in observations:
        by_length.setdefault(_n(tok, obs), set()).add(blind_text(obs, tok))
    assert all(len(texts) == 1 for texts in by_length.values())  # the filler depends on the length alone


def _rollout(char_tok, fake_engine, observations: str):
    script = char_tok("<answer>right</answer>", add_special_tokens=False)["input_ids"]
    script = script + [char_tok.convert_tokens_to_ids("<|end|>")]
    engine = fake_engine(lambda call, i, prompt: script)
    cfg = AgentConfig(max_turn=3, think=False, layout="turn", observations=observations)
    spec = [EnvGroupSpec("test_line", {"horizon": 3}, 1, 2)]
    return engine, AgentProxy(engine, char_tok, cfg, spec, []).rollout()


def test_blind_prompts_hide_every_observation_and_keep_their_length(char_tok, fake_engine):
    seen_engine, seen = _rollout(char_tok, fake_engine, "shown")
    blind_engine, blind = _rollout(char_tok, fake_engine, "blind")
    shown_prompts = [p for call in seen_engine.calls for p in call[0]]
    blind_prompts = [p for call in blind_engine.calls for p in call[0]]
    assert [len(p) for p in shown_prompts] == [len(p) for p in blind_prompts]
    assert all("pos=" in char_tok.decode(p) for p in shown_prompts)
    assert not any("pos=" in char_tok.decode(p) for p in blind_prompts)
    # The env still runs on the real state: the same actions earn the same rewards.
    assert blind.turn_rewards.tolist() == seen.turn_rewards.tolist()
    # gigpo's anchor states are what the policy saw: the real observations, or fillers that never name the state
    assert ["pos=0", "pos=1", "pos=2"] in seen.turn_obs_keys
    fillers = {key for keys in blind.turn_obs_keys for key in keys}
    assert fillers == {blind_text("pos=0", char_tok)} and not any("pos=" in key for key in fillers)
    assert "blank" in blind.episodes[0].turns[1].prompt_text


def test_unknown_value_is_named():
    with pytest.raises(ValueError, match="observations must be one of"):
        AgentConfig(observations="hidden")
