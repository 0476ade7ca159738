"""The MS-GRPO paper's search_qa runs through the trainer (tiny model, 2 steps each), the outcome-only reward
switch and the validation rule that guards the step / outcome split."""

import pytest
import torch
from trainer_helpers import assert_all_finite, read_metrics, tiny_overrides

from ragen.agent.batch import RolloutBatch
from ragen.trainer import phases
from ragen.trainer.compose import load_train_config
from ragen.trainer.main import run
from ragen.trainer.validate import validate

RUNS = ("ms_grpo", "ms_po", "grpo_outcome", "grpo_step")
FAST = ["trainer.use_ray=false", "trainer.val_before_train=false", "rollout.val_n_groups=1"]


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
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1, 1], [-1, -1, 0, 0, -1, -1]])
    rewards = torch.zeros(2, 6)
    rewards[0, 2], rewards[0, 5], rewards[1, 3] = 0.7, 1.2, 0.3
    resp = (turn_ids >= 0).long()
    return RolloutBatch(
        input_ids=torch.zeros(2, 6, dtype=torch.long), attention_mask=torch.ones(2, 6, dtype=torch.long),
        response_mask=resp, turn_ids=turn_ids, token_rewards=rewards, sample_log_probs=torch.zeros(2, 6),
        group_ids=torch.tensor([0, 0]), turn_rewards=torch.tensor([[0.7, 1.2], [0.3, 0.0]]),
        num_turns=torch.tensor([2, 1]), truncated=torch.tensor([False, False]),
        step_rewards=torch.tensor([[0.2, 0.0], [0.3, 0.0]]), outcome_rewards=torch.tensor([1.7, 0.0]),
    )


def test_without_step_rewards_takes_each_turns_step_reward_off_its_last_token():
    out = phases.without_step_rewards(_batch())
    expected = torch.zeros(2, 6)
    expected[0, 2], expected[0, 5] = 0.5, 1.2  # 0.7 - 0.2, 1.2 - 0.0; row 1: 0.3 - 0.3
    torch.testing.assert_close(out.token_rewards, expected)
    # the outcome-only totals equal the outcome rewards the env reported
    torch.testing.assert_close(out.token_rewards.sum(1), out.outcome_rewards)
