"""Gradient scale and micro-batches of the ArCHer family: ``archer.summed_micro_batches=N`` (the reference code's
sum of N micro-batch means) scales the pre-clip gradient by exactly that count;
``archer.critic_micro_batch_size`` runs the critic in passes whose accumulated gradient is the one-pass gradient;
``archer.bc_loss_agg`` scales online filtered BC's gradient by tokens per utterance."""

import pytest
import torch

from ragen.algorithms import archer as A
from ragen.archer.critic import ArcherCriticWorker, CriticSettings
from ragen.archer.trainer import critic_settings
from ragen.archer.transitions import policy_batch
from ragen.archer.workers import ArcherPolicyWorker
from ragen.trainer.config.compose import load_train_config
from ragen.workers import ActorConfig, LocalWorkerGroup

STATES = ["Is it an animal? no.", "Is it alive? yes. Is it a plant? no.", "Is it red?", "Guess: cat. wrong."]
ACTIONS = ["Is it a fish?", "Is it a tree?", "Is it an apple?", "Is it a dog?"]
UPDATE = {"states": STATES, "actions": ACTIONS, "rewards": [-1.0, 0.0, -1.0, 1.0],
          "next_states": [s + " more" for s in STATES], "dones": [False, True, False, True],
          "pi_actions": list(reversed(ACTIONS))}  # one mini-batch of 4 turns


def _critic(**kw) -> ArcherCriticWorker:
    """A tiny critic without gradient clipping: after ``update`` its ``.grad`` holds the mini-batch's gradient."""
    return ArcherCriticWorker(CriticSettings(encoder="tiny", hidden=16, lr=1e-2, batch_size=4, tau=0.5, seed=3,
                                             grad_clip=None, **kw))


def _grads(worker: ArcherCriticWorker) -> list[torch.Tensor]:
    return [p.grad.clone() for p in worker.params]


def _count_encoder_passes(worker: ArcherCriticWorker) -> list[int]:
    passes = [0]
    worker.online.encoder.register_forward_hook(lambda *args: passes.__setitem__(0, passes[0] + 1))
    return passes


def test_critic_micro_batches_accumulate_the_one_pass_gradient():
    one, micro = _critic(), _critic(micro_batch_size=1)
    passes_one, passes_micro = _count_encoder_passes(one), _count_encoder_passes(micro)
    m_one, m_micro = one.update(**UPDATE), micro.update(**UPDATE)
    assert (passes_one[0], passes_micro[0]) == (1, 4)  # the online critic ran 4 passes of 1 turn
    for a, b in zip(_grads(one), _grads(micro), strict=True):
        torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-5)
    assert max(float(g.abs().max()) for g in _grads(one)) > 1e-3
    for k in ("critic/loss", "critic/q_loss", "critic/v_loss", "critic/grad_norm", "critic/q_mean", "critic/v_mean",
              "critic/target_q_mean"):
        assert m_micro[k] == pytest.approx(m_one[k], rel=1e-5, abs=1e-7), k
    # inference in passes of 3 rows (3 + 1) equals one pass
    three = _critic(micro_batch_size=3)
    torch.testing.assert_close(three.scores(STATES, ACTIONS), _critic().scores(STATES, ACTIONS), atol=1e-6, rtol=1e-5)


def test_critic_loss_of_micro_batches_adds_up_to_the_mean():
    g = torch.Generator().manual_seed(0)
    q1, q2, v1, v2, yq1, yq2, yv1, yv2 = torch.randn(8, 5, generator=g)
    full = A.critic_loss(q1, q2, v1, v2, yq1, yq2, yv1, yv2)
    mse = torch.nn.functional.mse_loss
    assert full.item() == pytest.approx((mse(q1, yq1) + mse(q2, yq2) + mse(v1, yv1) + mse(v2, yv2)).item())
    parts = [A.critic_loss(*(x[sl] for x in (q1, q2, v1, v2, yq1, yq2, yv1, yv2)), num_rows=5)
             for sl in (slice(0, 2), slice(2, 5))]
    assert sum(p.item() for p in parts) == pytest.approx(full.item())


def test_sum_of_means_scales_the_critic_gradient_by_the_micro_batch_count():
    mean, summed = _critic(), _critic(loss_scale=4.0)
    m1, m4 = mean.update(**UPDATE), summed.update(**UPDATE)
    assert m4["critic/grad_norm"] == pytest.approx(4 * m1["critic/grad_norm"], rel=1e-5)
    for a, b in zip(_grads(mean), _grads(summed), strict=True):
        torch.testing.assert_close(b, 4 * a, atol=1e-7, rtol=1e-5)
    assert m4["critic/loss"] == pytest.approx(m1["critic/loss"], rel=1e-6)  # the reported loss is unscaled


def test_summed_micro_batches_reach_the_workers_and_bad_values_name_the_key():
    paper = load_train_config("archer_twenty_questions_paper")
    s = critic_settings(paper)
    assert (paper.archer.summed_micro_batches, paper.archer.loss_scale) == (32, 32.0)
    assert (s.loss_scale, s.micro_batch_size, s.batch_size) == (32.0, 8, 256)
    assert load_train_config("archer_twenty_questions").archer.loss_scale == 1.0
    with pytest.raises(ValueError, match="archer.summed_micro_batches=1 must be >= 2"):
        load_train_config("archer_twenty_questions", ["archer.summed_micro_batches=1"])
    with pytest.raises(ValueError, match="archer.summed_micro_batches=3 must divide archer.batch_size=8"):
        load_train_config("archer_twenty_questions", ["archer.summed_micro_batches=3"])
    with pytest.raises(ValueError, match="archer.critic_micro_batch_size=0"):
        load_train_config("archer_twenty_questions", ["archer.critic_micro_batch_size=0"])
    from ragen.archer.main import check_archer

    problems = check_archer(load_train_config("filtered_bc_twenty_questions", ["archer.critic_micro_batch_size=2"]))
    assert any("archer.critic_micro_batch_size=2 has no effect" in p for p in problems)
    problems = check_archer(load_train_config("archer_twenty_questions", ["archer.bc_loss_agg=utterance-sum"]))
    assert any("archer.bc_loss_agg='utterance-sum'" in p for p in problems)


@pytest.fixture(scope="module")
def policy_path():
    from ragen.trainer.builders import prepare_model

    return prepare_model(load_train_config("base", ["model=tiny"]))[0]


def _first_step(path: str, method: str, batch, **kw) -> dict[str, float]:
    """The metrics of ``method`` on a fresh tiny policy (one optimizer step of 8 rows in micro-batches of 2)."""
    cfg = ActorConfig(lr=1e-3, mini_batch_size=8, micro_batch_size=2, mixed_precision="fp32")
    return LocalWorkerGroup(ArcherPolicyWorker, model_name_or_path=path, cfg=cfg).call(method, batch, **kw)


def test_policy_updates_scale_the_gradient_exactly(policy_path):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 900, (int(n),), generator=g).tolist() for n in torch.randint(3, 9, (8,), generator=g)]
    actions = [torch.randint(5, 900, (int(n),), generator=g).tolist() for n in torch.randint(1, 6, (8,), generator=g)]
    rl = policy_batch(prompts, actions, pad_id=0, advantages=torch.randn(8, generator=g))
    m1 = _first_step(policy_path, "reinforce_update", rl)
    m4 = _first_step(policy_path, "reinforce_update", rl, loss_scale=4.0)
    assert m4["actor/grad_norm"] == pytest.approx(4 * m1["actor/grad_norm"], rel=1e-4)
    assert m4["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], rel=1e-5)
    # filtered BC: token-mean divides the summed NLL by the tokens, utterance-sum by the utterances
    bc = policy_batch(prompts, actions, pad_id=0)
    per_utt = sum(len(a) for a in actions) / len(actions)
    tok, utt = _first_step(policy_path, "bc_update", bc), _first_step(policy_path, "bc_update", bc, agg="utterance-sum")
    assert tok["sft/loss"] == pytest.approx(tok["sft/nll"], rel=1e-5)
    assert utt["sft/nll"] == pytest.approx(tok["sft/nll"], rel=1e-6)
    assert utt["sft/loss"] == pytest.approx(per_utt * tok["sft/loss"], rel=1e-5)
    assert utt["actor/grad_norm"] == pytest.approx(per_utt * tok["actor/grad_norm"], rel=1e-4)
    scaled = _first_step(policy_path, "bc_update", bc, loss_scale=4.0)
    assert scaled["actor/grad_norm"] == pytest.approx(4 * tok["actor/grad_norm"], rel=1e-4)
