"""The turn layout trains like the trajectory layout: same per-token advantages, padded worker batches."""

import torch
from trainer_helpers import assert_all_finite, read_metrics, tiny_overrides

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.models import load_tokenizer
from ragen.rollout.base import Sample
from ragen.trainer.compose import load_train_config
from ragen.trainer.main import run
from ragen.trainer.phases import advantages, filter_groups_by_std
from ragen.trainer.turn_layout import pad_rows, row_multiple, turn_layout_advantages
from ragen.workers.data import TrainBatch


class ScriptedEngine:
    """Answers each prompt with a fixed action sequence that depends on the call count (deterministic)."""

    def __init__(self, tokenizer):
        self.tok, self.calls = tokenizer, 0

    def generate(self, prompts, sampling):
        self.calls += 1
        texts = ["<answer>Right</answer>", "<answer>Down</answer>", "nonsense", "<answer>Up</answer>"]
        out = []
        for i, _ in enumerate(prompts):
            ids = self.tok.encode(texts[(i + self.calls) % 4], add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(Sample(ids, [-0.5] * len(ids), "stop"))
        return out

    def update_weights(self, state_dict):
        return None


def _rollout(layout: str):
    tok = load_tokenizer()
    agent = AgentConfig(max_turn=3, think=False, max_new_tokens=16, layout=layout)
    spec = [EnvGroupSpec("frozen_lake", {"size": 4}, n_groups=2, group_size=2)]
    return AgentProxy(ScriptedEngine(tok), tok, agent, spec, spec, seed=5).rollout("train")


def _per_episode(batch, x, episode_of_row):
    out = {}
    for r in range(batch.batch_size):
        out.setdefault(episode_of_row[r], []).extend(x[r][batch.response_mask[r].bool()].tolist())
    return out


def test_turn_layout_advantages_equal_trajectory_layout():
    traj, turn = _rollout("trajectory"), _rollout("turn")
    assert turn.batch_size > traj.batch_size  # several turns per episode
    for name in ("gae", "bilevel_gae", "grpo"):
        kw = dict(gamma=0.9, lam=0.8, high_level_gamma=0.95, whiten=False)
        vt = (traj.input_ids % 13).float() / 13
        vn = (turn.input_ids % 13).float() / 13
        a1, r1 = advantages(name, traj, traj.token_rewards, vt, **kw)
        a2, r2 = turn_layout_advantages(name, turn, turn.token_rewards, vn, **kw)
        e1 = _per_episode(traj, a1, list(range(traj.batch_size)))
        e2 = _per_episode(turn, a2, turn.extra["episode_index"].tolist())
        assert e1.keys() == e2.keys()
        for e in e1:
            assert torch.allclose(torch.tensor(e1[e]), torch.tensor(e2[e]), atol=1e-5), (name, e)
        assert torch.equal(a2[~turn.response_mask.bool()], torch.zeros_like(a2[~turn.response_mask.bool()]))
        assert r2.abs().sum() > 0


def test_filter_reindexes_turn_rows_and_padding():
    turn = _rollout("turn")
    turn.turn_rewards[turn.group_ids == 1] += torch.arange(int((turn.group_ids == 1).sum())).view(-1, 1).float()
    kept, _ = filter_groups_by_std(turn, 0.5)
    assert set(kept.group_ids.tolist()) == {1}
    assert kept.extra["episode_index"].shape[0] == kept.batch_size
    assert set(kept.extra["episode_index"].tolist()) == {2, 3}
    tb = TrainBatch(input_ids=kept.input_ids, attention_mask=kept.attention_mask, response_mask=kept.response_mask)
    m = row_multiple(4, 8, 1)
    padded = pad_rows(tb, m, 0)
    assert m == 8 and padded.batch_size % 8 == 0 and padded.batch_size - tb.batch_size < 8
    assert padded.response_mask[tb.batch_size:].sum() == 0 and padded.attention_mask[tb.batch_size:, 0].eq(1).all()


def test_turn_layout_trains_end_to_end(tmp_path):
    overrides = [*tiny_overrides(tmp_path, 1), "trainer.use_ray=false", "agent.layout=turn", "env.max_turn=2",
                 "agent.max_context_window=1", "trainer.val_before_train=false"]
    metrics = run(load_train_config("ppo_multi_turn", overrides))
    assert metrics["rollout/batch_size"] >= 4 and "actor/pg_loss" in metrics
    assert_all_finite(read_metrics(tmp_path))
