"""The MS-GRPO paper's search_qa runs through the trainer (tiny model, 2 steps each), the outcome-only reward
switch, the validation rule that guards the step / outcome split, and the env's tool-result flags reaching the
estimators in both layouts."""

import json
from dataclasses import replace

import pytest
import torch
from factories import rollout_batch
from trainer_helpers import assert_all_finite, read_metrics, tiny_overrides

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.agent.batch import RolloutBatch
from ragen.algorithms import compute_advantage
from ragen.launch import run, validate
from ragen.models import load_tokenizer
from ragen.trainer import credit
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.layout import turn_layout_advantages

RUNS = ("ms_grpo", "ms_po", "grpo_outcome", "grpo_step")
FAST = ["trainer.use_ray=false", "trainer.val_before_train=false", "rollout.val_n_groups=1"]


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_search_qa_run_trains_two_steps(tmp_path, name):
    cfg = load_train_config(f"search_qa_{name}", [*tiny_overrides(tmp_path, 2), *FAST])
    assert cfg.env.name == "search_qa"
    run(cfg)
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    steps = [r for r in records if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("critic/vf_loss" not in r for r in records)  # critic-free


@pytest.mark.parametrize("overrides", [["algorithm=ms_grpo"], ["algorithm=ms_po"],
                                       ["algorithm=grpo", "algorithm.use_step_reward=false"]])
def test_step_split_estimators_are_rejected_on_envs_without_the_split(overrides):
    cfg = load_train_config("base", ["env=frozen_lake", *overrides])
    with pytest.raises(ValueError, match="reports step and outcome rewards separately.*search_qa"):
        validate(cfg)
    validate(load_train_config("base", ["env=search_qa", *overrides]))  # the same settings pass there


def _batch() -> RolloutBatch:
    """Two rows: row 0 has turns at positions 1-2 (reward 0.7 = step 0.2 + outcome 0.5 on position 2) and 4-5
    (reward 1.2 = step 0.0 + outcome 1.2 on 5); row 1 has one turn at 2-3 (reward 0.3 = step 0.3 on 3)."""
    return rollout_batch(
        [[([0], -1), ([0, 0], 0), ([0], -1), ([0, 0], 1)], [([0, 0], -1), ([0, 0], 0), ([0, 0], -1)]],
        [[0.7, 1.2], [0.3]], group_ids=[0, 0],
        step_rewards=torch.tensor([[0.2, 0.0], [0.3, 0.0]]), outcome_rewards=torch.tensor([1.7, 0.0]),
    )


def test_without_step_rewards_takes_each_turns_step_reward_off_its_last_token():
    out = credit.without_step_rewards(_batch())
    expected = torch.zeros(2, 6)
    expected[0, 2], expected[0, 5] = 0.5, 1.2  # 0.7 - 0.2, 1.2 - 0.0; row 1: 0.3 - 0.3
    torch.testing.assert_close(out.token_rewards, expected)
    # the outcome-only totals equal the outcome rewards the env reported
    torch.testing.assert_close(out.token_rewards.sum(1), out.outcome_rewards)


def _search_qa_rollout(layout: str, fake_engine) -> RolloutBatch:
    """One search_qa group of 4: episodes 0, 1 search, then answer; episodes 2, 3 answer at once (different
    lengths, two of them without a tool result)."""
    tok = load_tokenizer()
    call = json.dumps({"name": "search", "args": {"query": "capital of Pakistan"}})
    say = {t: tok.encode(f"<answer>{t}</answer>", add_special_tokens=False) + [tok.eos_token_id]
           for t in (call, "Islamabad", "Lahore")}

    def script(c, i, prompt):
        if c == 0:
            return say[call] if i < 2 else say["Islamabad" if i == 2 else "Lahore"]
        return say["Islamabad" if i == 0 else "Lahore"]

    agent = AgentConfig(max_turn=3, think=False, max_new_tokens=64, layout=layout,
                        max_context_window=1 if layout == "turn" else None)
    spec = [EnvGroupSpec("search_qa", {}, n_groups=1, group_size=4)]
    return AgentProxy(fake_engine(script), tok, agent, spec, spec, seed=3).rollout("train")


def _episode_tokens(batch: RolloutBatch, adv: torch.Tensor, episodes: list[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in range(batch.batch_size):
        out.setdefault(episodes[r], []).extend(adv[r][batch.response_mask[r].bool()].tolist())
    return out


def test_tool_results_reach_ms_grpo_and_ms_po_in_both_layouts(fake_engine):
    traj, turn = _search_qa_rollout("trajectory", fake_engine), _search_qa_rollout("turn", fake_engine)
    # the env's flags, per turn: the search turn received a tool result, answers did not
    assert traj.tool_results.tolist() == [[True, False], [True, False], [False, False], [False, False]]
    assert traj.num_turns.tolist() == [2, 2, 1, 1]
    inputs = credit.advantage_inputs(traj, None, None, None)
    assert torch.equal(inputs.tool_results, traj.tool_results)
    first_rows = turn.turn_index == 0
    assert turn.tool_results[first_rows].tolist() == traj.tool_results.tolist()
    for name in ("ms_grpo", "ms_po"):
        a1, _ = credit.advantages(name, traj, None)
        a2, _ = turn_layout_advantages(name, turn, None)
        e1 = _episode_tokens(traj, a1, list(range(traj.batch_size)))
        e2 = _episode_tokens(turn, a2, turn.episode_index.tolist())
        assert e1.keys() == e2.keys() == {0, 1, 2, 3}
        for e in e1:
            torch.testing.assert_close(torch.tensor(e2[e]), torch.tensor(e1[e]), atol=1e-6, rtol=0)
        # without the flags, every turn would be scored as if no tool had answered: the flags change the result
        no_tools, _ = compute_advantage(name, replace(inputs, tool_results=torch.zeros_like(inputs.tool_results)))
        assert not torch.allclose(no_tools, a1)
