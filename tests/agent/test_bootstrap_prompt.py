"""Episodes cut by the length budget (``truncated``): no row passes ``max_model_len``, the trajectory row ends at the
last response (the observation that did not fit is not in it), and both layouts bootstrap from the same state, the
next generation prompt cut to the budget (``EpisodeContext.bootstrap_prompt``), through the same value pass, so their
advantages agree on truncated episodes too."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.agent.context import ChatFormat
from ragen.agent.rollout import user_text
from ragen.env import StepResult, register
from ragen.ppo.truncation import bootstrap_values
from ragen.trainer.credit import advantages
from ragen.trainer.layout import turn_layout_advantages

GROW = 300  # characters added to the observation per step


@register("test_grow")
class GrowEnv:
    """Every step succeeds and the observation grows by ``GROW`` characters: a later turn no longer fits."""

    instructions = "Grow."

    def reset(self, seed: int) -> str:
        self.k = 0
        return "obs0"

    def legal_actions(self) -> str:
        return "go"

    def step(self, action: str) -> StepResult:
        self.k += 1
        return StepResult(f"obs{self.k} " + "z" * (GROW * self.k), 1.0, False,
                          {"action_is_valid": True, "action_is_effective": True, "success": False})


def _answer(tok):
    ids = tok("<answer>go</answer>", add_special_tokens=False)["input_ids"]
    return lambda call, i, prompt: ids + [tok.convert_tokens_to_ids("<|end|>")]


def _budget(tok, cfg: AgentConfig) -> int:
    """A ``max_model_len`` at which turns 0 and 1 are generated and turn 2's history-free prompt leaves no room."""
    fmt = ChatFormat(tok)
    obs2 = "obs2 " + "z" * (2 * GROW)
    head2 = fmt.first_prompt(f"{GrowEnv.instructions}\n\n{user_text(cfg, obs2, 'go', 2, cfg.max_turn, 1)}")
    return len(head2) - 1


def _rollouts(char_tok, fake_engine):
    base = AgentConfig(max_turn=4, think=False, max_new_tokens=24)
    cfg = dataclasses.replace(base, max_model_len=_budget(char_tok, base))
    spec = [EnvGroupSpec("test_grow", {}, n_groups=1, group_size=2)]
    out = {}
    for layout in ("trajectory", "turn"):
        engine = fake_engine(_answer(char_tok))
        out[layout] = AgentProxy(engine, char_tok, dataclasses.replace(cfg, layout=layout), spec, []).rollout()
        out[layout + "_prompts"] = [p for call in engine.calls for p in call[0]]
    return cfg, out


def test_truncated_rows_stay_in_the_budget_and_end_at_the_last_response(char_tok, fake_engine):
    cfg, out = _rollouts(char_tok, fake_engine)
    traj, turn = out["trajectory"], out["turn"]
    assert traj.truncated.tolist() == [True, True] and traj.num_turns.tolist() == [2, 2]
    eot = char_tok.convert_tokens_to_ids("<|end|>")
    for batch in (traj, turn):
        assert int(batch.attention_mask.sum(dim=1).max()) <= cfg.max_model_len  # no pass runs past the budget
    for r in range(traj.batch_size):  # the trajectory row ends with the last response's end-of-turn token
        n = int(traj.attention_mask[r].sum())
        assert int(traj.input_ids[r, n - 1]) == eot and int(traj.turn_ids[r, n - 2]) == 1
        assert "obs2" not in char_tok.decode(traj.input_ids[r, :n].tolist())
    # the bootstrap state: the same prompt in both layouts, on every row of the episode, within the budget
    assert traj.bootstrap_prompts == [turn.bootstrap_prompts[0], turn.bootstrap_prompts[-1]]
    assert len({tuple(p) for p in turn.bootstrap_prompts}) == 1
    boot = traj.bootstrap_prompts[0]
    assert len(boot) == cfg.max_model_len  # the history-free prompt is one token too long: its last tokens kept
    text = char_tok.decode(boot)
    assert text.endswith("<|assistant|>") and "obs2 zz" in text and "Turn 3." in text


class ValueGroup:
    """Stands in for the critic group: V after a row's last token = a function of the whole row, so two layouts get
    the same bootstrap only when they read the same state."""

    def __init__(self):
        self.calls = []

    def call(self, method, tb):
        assert method == "compute_values"
        self.calls.append(tb.batch_size)
        last = torch.tensor([float((row[m.bool()] % 7).sum()) / 50 for row, m in zip(tb.input_ids, tb.attention_mask,
                                                                                      strict=True)])
        return torch.zeros(tb.input_ids.shape), last


@pytest.mark.parametrize("name", ["gae", "turn_gae", "bilevel_gae"])
def test_layouts_agree_on_truncated_episodes(char_tok, fake_engine, name):
    _, out = _rollouts(char_tok, fake_engine)
    traj, turn = out["trajectory"], out["turn"]
    group = ValueGroup()
    b_traj, b_turn = bootstrap_values(group, traj, 0, 2), bootstrap_values(group, turn, 0, 2)
    assert group.calls == [2, 2]  # one distinct prompt per call, padded to the row multiple
    assert torch.equal(b_traj, b_turn[[0, -1]]) and float(b_traj[0]) != 0
    kw = dict(gamma=0.9, lam=0.8, high_level_gamma=0.95, whiten=False)
    vt, vn = (traj.input_ids % 13).float() / 13, (turn.input_ids % 13).float() / 13
    a1, _ = advantages(name, traj, vt, b_traj, **kw)
    a2, _ = turn_layout_advantages(name, turn, vn, b_turn, **kw)
    e1 = {r: a1[r][traj.response_mask[r].bool()] for r in range(traj.batch_size)}
    e2 = {}
    for r, e in enumerate(turn.episode_index.tolist()):
        e2.setdefault(e, []).append(a2[r][turn.response_mask[r].bool()])
    for e in e1:
        torch.testing.assert_close(e1[e], torch.cat(e2[e]), atol=1e-5, rtol=1e-5)
    a0, _ = advantages(name, traj, vt, torch.zeros(2), **kw)
    assert not torch.allclose(a0, a1)  # the bootstrap value enters the advantages
