"""RolloutBatch.select picks rows of every per-row field, ``extra`` included."""

from __future__ import annotations

import torch

from ragen.agent.batch import RolloutBatch


def _batch(b: int = 4, t: int = 3) -> RolloutBatch:
    rows = torch.arange(b).unsqueeze(1).expand(b, t)
    return RolloutBatch(
        input_ids=rows.clone(), attention_mask=torch.ones(b, t, dtype=torch.long),
        response_mask=torch.ones(b, t, dtype=torch.long), turn_ids=torch.zeros(b, t, dtype=torch.long),
        token_rewards=rows.float(), sample_log_probs=-rows.float(), group_ids=torch.arange(b) // 2,
        turn_rewards=torch.arange(b).float().unsqueeze(1), num_turns=torch.ones(b, dtype=torch.long),
        truncated=torch.tensor([True, False, True, False]), turn_obs_keys=[[f"o{i}"] for i in range(b)],
        step_rewards=rows[:, :2].float(), outcome_rewards=torch.arange(b).float(),
        tool_results=torch.tensor([[True, False], [False, False], [False, True], [True, True]]),
        extra={"failed": torch.tensor([0, 1, 0, 1]), "names": ["a", "b", "c", "d"], "note": "kept", "k": torch.ones(2)},
    )  # fmt: skip


def test_select_reorders_all_per_row_fields():
    out = _batch().select([3, 0])
    assert out.input_ids[:, 0].tolist() == [3, 0]
    assert out.group_ids.tolist() == [1, 0]
    assert out.truncated.tolist() == [False, True]
    assert out.turn_obs_keys == [["o3"], ["o0"]]
    assert out.step_rewards.tolist() == [[3.0, 3.0], [0.0, 0.0]] and out.outcome_rewards.tolist() == [3.0, 0.0]
    assert out.tool_results.tolist() == [[True, True], [True, False]]
    assert out.extra["failed"].tolist() == [1, 0]
    assert out.extra["names"] == ["d", "a"]
    assert out.extra["note"] == "kept" and out.extra["k"].shape == (2,)  # not per-row: passed through
