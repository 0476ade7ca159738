"""The turn layout trains like the trajectory layout: same per-token advantages, each turn's advantage on exactly
that turn sample's model tokens, padded worker batches. (``fake_engine`` comes from tests/conftest.py.)"""

import pytest
import torch
from trainer_helpers import assert_all_finite, read_metrics, tiny_overrides

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec
from ragen.agent.batch import RolloutBatch
from ragen.algorithms import ADVANTAGE_ESTIMATORS, register_estimator
from ragen.launch import run
from ragen.models import load_tokenizer
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.credit import advantages, filter_groups_by_std
from ragen.trainer.layout import pad_rows, row_multiple, turn_layout_advantages
from ragen.workers.data import TrainBatch

TEXTS = ["<answer>Right</answer>", "<answer>Down</answer>", "nonsense", "<answer>Up</answer>"]


def _rollout(layout: str, fake_engine):
    """Frozen-lake episodes answered with a fixed action sequence that depends on the call count."""
    tok = load_tokenizer()
    scripts = [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in TEXTS]
    engine = fake_engine(lambda call, i, prompt: scripts[(i + call + 1) % 4])
    agent = AgentConfig(max_turn=3, think=False, max_new_tokens=16, layout=layout)
    spec = [EnvGroupSpec("frozen_lake", {"size": 4}, n_groups=2, group_size=2)]
    return AgentProxy(engine, tok, agent, spec, spec, seed=5).rollout("train")


def _per_episode(batch, x, episode_of_row):
    out = {}
    for r in range(batch.batch_size):
        out.setdefault(episode_of_row[r], []).extend(x[r][batch.response_mask[r].bool()].tolist())
    return out


def test_turn_layout_advantages_equal_trajectory_layout(fake_engine):
    traj, turn = _rollout("trajectory", fake_engine), _rollout("turn", fake_engine)
    assert turn.batch_size > traj.batch_size  # several turns per episode
    for name in ("gae", "bilevel_gae", "grpo"):
        kw = dict(gamma=0.9, lam=0.8, high_level_gamma=0.95, whiten=False)
        vt = (traj.input_ids % 13).float() / 13
        vn = (turn.input_ids % 13).float() / 13
        a1, r1 = advantages(name, traj, vt, **kw)
        a2, r2 = turn_layout_advantages(name, turn, vn, **kw)
        e1 = _per_episode(traj, a1, list(range(traj.batch_size)))
        e2 = _per_episode(turn, a2, turn.episode_index.tolist())
        assert e1.keys() == e2.keys()
        for e in e1:
            assert torch.allclose(torch.tensor(e1[e]), torch.tensor(e2[e]), atol=1e-5), (name, e)
        assert torch.equal(a2[~turn.response_mask.bool()], torch.zeros_like(a2[~turn.response_mask.bool()]))
        assert r2.abs().sum() > 0


def test_filter_reindexes_turn_rows_and_padding(fake_engine):
    turn = _rollout("turn", fake_engine)
    turn.turn_rewards[turn.group_ids == 1] += torch.arange(int((turn.group_ids == 1).sum())).view(-1, 1).float()
    kept, _ = filter_groups_by_std(turn, 0.5)
    assert set(kept.group_ids.tolist()) == {1}
    assert kept.episode_index.shape[0] == kept.batch_size
    assert set(kept.episode_index.tolist()) == {2, 3}
    tb = TrainBatch(input_ids=kept.input_ids, attention_mask=kept.attention_mask, response_mask=kept.response_mask)
    m = row_multiple(4, 8, 1)
    padded = pad_rows(tb, m, 0)
    assert m == 8 and padded.batch_size % 8 == 0 and padded.batch_size - tb.batch_size < 8
    assert padded.response_mask[tb.batch_size:].sum() == 0 and padded.attention_mask[tb.batch_size:, 0].eq(1).all()


# Hand-built turn-layout batch: (episode, turn, prompt length, response length) per row, rows deliberately out of
# episode/turn order; each row is [prompt][response][closing token][pad]. Episode 0 has 3 turns, episode 1 has 2.
ROWS = [(1, 1, 6, 2), (0, 2, 9, 3), (0, 0, 3, 2), (1, 0, 4, 4), (0, 1, 5, 1)]
TURN_REWARDS = {0: [1.0, 0.0, 2.0], 1: [0.0, 1.0]}


def _hand_batch(truncated=(False, False)) -> RolloutBatch:
    b, t = len(ROWS), max(p + r + 1 for _, _, p, r in ROWS) + 2
    ids = torch.zeros(b, t, dtype=torch.long)
    attn = torch.zeros(b, t, dtype=torch.long)
    turn_ids = torch.full((b, t), -1, dtype=torch.long)
    rewards = torch.zeros(b, t)
    turn_rewards = torch.zeros(b, 3)
    for row, (ep, k, p, r) in enumerate(ROWS):
        ids[row, : p + r + 1] = torch.arange(10, 10 + p + r + 1)
        attn[row, : p + r + 1] = 1
        turn_ids[row, p : p + r] = k
        rewards[row, p + r - 1] = TURN_REWARDS[ep][k]  # the turn's reward on its last model token
        turn_rewards[row, : len(TURN_REWARDS[ep])] = torch.tensor(TURN_REWARDS[ep])
    episodes = torch.tensor([ep for ep, *_ in ROWS])
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, response_mask=(turn_ids >= 0).long(), turn_ids=turn_ids,
        token_rewards=rewards, sample_log_probs=torch.zeros(b, t), group_ids=episodes.clone(),
        turn_rewards=turn_rewards, num_turns=torch.tensor([len(TURN_REWARDS[ep]) for ep, *_ in ROWS]),
        truncated=torch.tensor([truncated[ep] for ep, *_ in ROWS]),
        episode_index=episodes, turn_index=torch.tensor([k for _, k, *_ in ROWS]),
    )


@pytest.fixture
def echo_estimator():
    """A registered estimator that returns (values, turn_ids) of the compact view it was given, and records it."""
    seen = []

    def echo(inp):
        seen.append(inp)
        return inp.values.clone(), inp.turn_ids.double()

    register_estimator("test_echo", echo, needs=("values",))
    try:
        yield seen
    finally:
        ADVANTAGE_ESTIMATORS.pop("test_echo", None)


def test_turn_layout_gather_and_scatter_by_hand(echo_estimator):
    batch = _hand_batch()
    code = (100 * torch.arange(batch.batch_size)[:, None] + torch.arange(batch.seq_len)[None]).double()
    adv, ret = turn_layout_advantages("test_echo", batch, code, whiten=False)
    # compact view: one row per episode, its model tokens in turn order (rows 2, 4, 1 / rows 3, 0), left-aligned
    (inp,) = echo_estimator
    expected = {0: [], 1: []}
    for ep, k in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]:
        row = next(i for i, (e, kk, *_) in enumerate(ROWS) if (e, kk) == (ep, k))
        p, r = ROWS[row][2], ROWS[row][3]
        expected[ep] += [(100 * row + c, k) for c in range(p, p + r)]
    for ep, toks in expected.items():
        n = len(toks)
        assert inp.response_mask[ep].long().tolist() == [1] * n + [0] * (inp.response_mask.shape[1] - n)
        assert inp.values[ep, :n].tolist() == [float(c) for c, _ in toks]
        assert inp.turn_ids[ep, :n].tolist() == [k for _, k in toks]
        assert inp.token_rewards[ep, :n].sum() == sum(TURN_REWARDS[ep])
        assert inp.group_ids[ep] == ep
    # scatter: every model token gets back exactly its own value; nothing lands on prompt, closing or pad tokens
    model = batch.response_mask.bool()
    assert torch.equal(adv[model].double(), code[model])
    assert torch.equal(ret[model].double(), batch.turn_ids[model].double())
    assert not adv[~model].any() and not ret[~model].any()


@pytest.mark.parametrize("truncated", [False, True])
def test_turn_gae_puts_each_turn_advantage_on_its_own_turn_row(truncated):
    """turn_gae with V = 0: A_k = r_k + gamma_H * A_{k+1}, and every model token of turn k's row carries A_k.
    A truncated episode bootstraps from its bootstrap value (per row, the same on every row of the episode)."""
    batch = _hand_batch(truncated=(False, truncated))
    boot_rows = torch.tensor([3.0, 7.0, 7.0, 3.0, 7.0])  # episode 1 (rows 0, 3): 3; episode 0 never truncated
    adv, ret = turn_layout_advantages("turn_gae", batch, torch.zeros(batch.input_ids.shape), boot_rows,
                                      high_level_gamma=0.5, high_level_lam=1.0, whiten=False)
    boot = 3.0 if truncated else 0.0
    a1_last = 1.0 + 0.5 * boot
    expected = {(0, 2): 2.0, (0, 1): 0.0 + 0.5 * 2.0, (0, 0): 1.0 + 0.5 * 1.0, (1, 1): a1_last, (1, 0): 0.5 * a1_last}
    for row, (ep, k, p, r) in enumerate(ROWS):
        assert adv[row, p : p + r].tolist() == [expected[ep, k]] * r, (row, ep, k)
        assert ret[row, p : p + r].tolist() == [expected[ep, k]] * r  # return = A + V(s_k), V = 0
    assert not adv[~batch.response_mask.bool()].any()


@pytest.mark.slow
def test_turn_layout_trains_end_to_end(tmp_path, monkeypatch):
    from ragen.workers import PolicyWorker

    updates = []
    real_update = PolicyWorker.update

    def spy(self, batch, **kwargs):
        updates.append(batch)
        return real_update(self, batch, **kwargs)

    monkeypatch.setattr(PolicyWorker, "update", spy)
    overrides = [*tiny_overrides(tmp_path, 1), "trainer.use_ray=false", "agent.layout=turn", "env.max_turn=2",
                 "agent.max_context_window=1", "trainer.val_before_train=false"]
    metrics = run(load_train_config("ppo_multi_turn", overrides))
    assert metrics["rollout/batch_size"] >= 4 and "actor/pg_loss" in metrics
    assert_all_finite(read_metrics(tmp_path))
    # the actor trained on turn rows padded to a multiple of its mini-batch, advantages only on model tokens
    (tb,) = updates
    assert tb.batch_size % 4 == 0 and tb.batch_size >= metrics["rollout/batch_size"]
    model = tb.response_mask.bool()
    assert model.any() and not tb.advantages[~model].any() and not tb.old_log_probs[~model].any()
    assert tb.advantages[model].abs().sum() > 0
    assert not model[int(metrics["rollout/batch_size"]):].any()  # padding rows train nothing
