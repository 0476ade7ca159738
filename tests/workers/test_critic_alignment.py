"""The critic's position convention, end to end through the worker and the estimator.

``values[:, t]`` must be V of the context *before* token t (docs/design.md, position conventions). A critic that
returns the value *after* token t gives every model token a baseline that already contains the token (a Q
value), and the advantage of the action that decided the reward fades to 0 as the critic learns.
"""

from __future__ import annotations

import torch
from factories import prompt_response, train_batch
from worker_helpers import make_lm, random_batch

from ragen.algorithms import AdvantageInputs, compute_advantage
from ragen.models.forward import hidden_states
from ragen.models.value_head import ValueModel
from ragen.workers import CriticConfig, CriticWorker, LocalWorkerGroup
from ragen.workers.data import TrainBatch

PROMPT, GOOD, BAD, EOT = [5, 6, 7, 8], 10, 11, 2


def _decisive_batch(n: int = 8) -> tuple[TrainBatch, torch.Tensor, torch.Tensor]:
    """One-turn episodes: prompt, one decisive answer token, the end-of-turn token. Reward 1 for GOOD, 0 for BAD,
    on the last model token (the end-of-turn token), half of each. Returns (batch, rewards (B, T), R (B,))."""
    batch = train_batch(prompt_response([PROMPT] * n, [[GOOD if i % 2 == 0 else BAD, EOT] for i in range(n)]))
    R = torch.tensor([1.0 if i % 2 == 0 else 0.0 for i in range(n)])
    rewards = torch.zeros(batch.input_ids.shape)
    rewards[:, -1] = R
    return batch, rewards, R


def _gae(rewards: torch.Tensor, values: torch.Tensor, resp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = AdvantageInputs(token_rewards=rewards, response_mask=resp, turn_ids=torch.where(resp > 0, 0, -1),
                             values=values)
    return compute_advantage("gae", inputs, gamma=1.0, lam=1.0, whiten=False)


def test_trained_critic_gives_the_decisive_token_its_advantage(model_dir):
    """Train only the critic on fixed samples to its loss floor; then token GAE (gamma = lam = 1, no whitening)
    gives the decisive answer token A = R(a) - E[R] = +-0.5. With values one token late, the critic's value at the
    decisive token has read it (~R(a)) and the advantage would be ~0."""
    batch, rewards, R = _decisive_batch()
    cfg = CriticConfig(lr=3e-3, mini_batch_size=8, micro_batch_size=8, mixed_precision="fp32", value_clip=10.0)
    critic = LocalWorkerGroup(CriticWorker, model_name_or_path=model_dir, cfg=cfg)
    losses = []
    for _ in range(150):
        values, _ = critic.call("compute_values", batch)
        _, returns = _gae(rewards, values, batch.response_mask)
        losses.append(critic.call("update", batch.with_fields(values=values, returns=returns))["critic/vf_loss"])
    # floor: at the decisive token the target R in {0, 1} has variance 0.25 given the prompt; at the end-of-turn
    # token the context holds the answer, so 0. value_loss = 0.5 * token mean = 0.5 * (0.25 + 0) / 2 = 0.0625
    assert losses[-1] < 0.0625 + 0.01, losses[-10:]
    values, _ = critic.call("compute_values", batch)
    adv, _ = _gae(rewards, values, batch.response_mask)
    decisive = adv[:, len(PROMPT)]
    assert (decisive - (R - 0.5)).abs().max() < 0.15, decisive


def test_values_are_the_head_on_the_previous_hidden_state():
    """values[:, t] = head(hidden[t - 1]) on real tokens whose previous token is real, 0 elsewhere;
    last_values = head(hidden at the last real token): right and left padding alike."""
    lm = make_lm(seed=4)
    vm = ValueModel.from_causal_lm(lm, head_init_std=0.5)
    ids, attn, _ = random_batch(B=3, T=10, seed=2)
    values, last = vm(ids, attn)
    with torch.no_grad():
        after = vm.head(hidden_states(vm.backbone, ids, attn)).squeeze(-1)
    for b in range(3):
        n = int(attn[b].sum())
        assert values[b, 0] == 0 and (values[b, n:] == 0).all()
        torch.testing.assert_close(values[b, 1:n], after[b, : n - 1])
        torch.testing.assert_close(last[b], after[b, n - 1])
    left_ids, left_attn = torch.zeros_like(ids), torch.zeros_like(attn)  # the same rows, left-padded
    for b in range(3):
        n = int(attn[b].sum())
        left_ids[b, 10 - n:], left_attn[b, 10 - n:] = ids[b, :n], 1
    lv, ll = vm(left_ids, left_attn)
    for b in range(3):
        n = int(attn[b].sum())
        assert (lv[b, : 10 - n + 1] == 0).all()  # padding and the first real token (no previous context)
        torch.testing.assert_close(lv[b, 10 - n:], values[b, :n], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ll, last, atol=1e-5, rtol=1e-4)


def test_worker_returns_values_and_last_values_per_row(model_dir, tmp_path):
    """``CriticWorker.compute_values`` chunks rows (trailing padding trimmed) and returns both outputs of the
    model; they equal one unchunked forward pass."""
    ids, attn, resp = random_batch(B=4, T=12, seed=5)
    cfg = CriticConfig(lr=1e-3, mini_batch_size=4, micro_batch_size=4, infer_micro_batch_size=1,
                       mixed_precision="fp32")
    critic = LocalWorkerGroup(CriticWorker, model_name_or_path=model_dir, cfg=cfg)
    with torch.no_grad():
        critic.worker.module.head.weight.normal_(0.0, 0.5)
        want_v, want_last = critic.worker.module(ids, attn)
    values, last = critic.call("compute_values", TrainBatch(input_ids=ids, attention_mask=attn, response_mask=resp))
    torch.testing.assert_close(values, want_v, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(last, want_last, atol=1e-5, rtol=1e-4)
    assert last.shape == (4,) and values.shape == (4, 12)
