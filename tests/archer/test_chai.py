"""Online CHAI's action (``ragen.archer.chai``) in the ArCHer trainer, with a fake engine and a fake critic: the V
target of the critic reads the agent's own action (CHAI: its best of k samples by target min-Q), and CHAI's greedy
validation is a deterministic choice among candidates sampled with the rollout's fixed seed."""

import pytest
from archer_fakes import RecordingGroup, prefer_candidate, record, trainer_with_fakes

from ragen.rollout.base import SamplingParams

K = 3


def _candidates_engine(fake_engine):
    """Row i of a call answers ``[100 + i % K]``: a prompt repeated K times gets candidates 100, 101, 102."""
    return fake_engine(lambda call, i, prompt: [100 + i % K])


@pytest.mark.parametrize(("config", "expected", "rows"), [
    ("chai_twenty_questions", ["102", "102"], 2 * K),  # best of K by target min-Q: candidate 2 for both states
    ("archer_twenty_questions", ["100", "101"], 2),  # one policy sample per state
])
def test_the_v_target_reads_the_agents_own_action(fake_engine, config, expected, rows):
    engine = _candidates_engine(fake_engine)
    critic = RecordingGroup(target_min_q=prefer_candidate(2, K), update={"critic/loss": 0.0})
    trainer = trainer_with_fakes(config, engine, [f"archer.chai_candidates={K}", "archer.critic_epochs=1",
                                                  "archer.batch_size=2", "actor.mini_batch_size=2"], critic=critic)
    trainer.buffer.add([record(0, 0, -1.0, [1, 2], [3]), record(1, 0, -1.0, [4, 5], [6])])
    trainer._critic_update()
    (update,) = [kw for method, _, kw in critic.calls if method == "update"]
    assert update["pi_actions"] == expected
    (prompts, sampling), = engine.calls
    assert len(prompts) == rows and sampling.temperature == trainer.cfg.agent.temperature


def test_greedy_validation_chooses_deterministically_among_seeded_candidates(fake_engine):
    engine = _candidates_engine(fake_engine)
    trainer = trainer_with_fakes("chai_twenty_questions", engine, [f"archer.chai_candidates={K}"],
                                 critic=RecordingGroup(target_min_q=prefer_candidate(1, K)))
    assert trainer.cfg.rollout.val_temperature == 0.0  # validated greedily, as every member of the family
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, seed=1234)  # what the validation proxy passes
    first = trainer._chai_responder(None, [[1, 2], [3]], greedy)
    again = trainer._chai_responder(None, [[1, 2], [3]], greedy)
    assert [s.token_ids for s in first] == [s.token_ids for s in again] == [[101], [101]]
    for prompts, sampling in engine.calls:  # K candidates per prompt, sampled (not greedy) with the rollout's seed
        assert len(prompts) == 2 * K and sampling.temperature == trainer.cfg.agent.temperature > 0
        assert (sampling.seed, sampling.max_new_tokens) == (1234, 8)
    train = SamplingParams(temperature=0.7, seed=5)  # a sampled rollout keeps its own sampling
    trainer._chai_responder(None, [[1]], train)
    assert engine.calls[-1][1] == train


def test_best_of_k_keeps_the_kv_cache_of_the_played_samples_only(default_tokenizer):
    """With an ``hf`` engine's prefix cache, the k - 1 discarded candidates' caches are freed and each played
    sample's is reused by the next turn; what is sampled is the same as without a cache (a memory knob)."""
    import torch

    from ragen.archer.chai import best_of_k
    from ragen.models import tiny_model
    from ragen.rollout.hf import HFEngine

    model = tiny_model(tokenizer=default_tokenizer, seed=0)
    cached, plain = HFEngine(model, default_tokenizer, prefix_cache=True), HFEngine(model, default_tokenizer)
    prompts = [[1, 2000, 300, 45, 9], [7, 8, 9]]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
    score = lambda states, actions: torch.arange(len(actions), dtype=torch.float) % K  # noqa: E731 (the last)
    played = best_of_k(cached, prompts, sampling, K, str, score)
    ref = best_of_k(plain, prompts, sampling, K, str, score)
    assert [s.token_ids for s in played] == [s.token_ids for s in ref]
    store = cached.prefix_store
    kept = sorted(ids for ids, _ in store.fresh)
    assert kept == sorted(p + s.token_ids[:-1] for p, s in zip(prompts, played, strict=True))
    turn2 = [p + s.token_ids + [50, 51] for p, s in zip(prompts, played, strict=True)]
    nxt = best_of_k(cached, turn2, sampling, K, str, score)
    assert store.hits == len(prompts) * K  # every candidate row of the next turn extends its played sample
    assert [s.token_ids for s in nxt] == [s.token_ids for s in best_of_k(plain, turn2, sampling, K, str, score)]


def test_the_critic_update_frees_the_engines_kept_caches(fake_engine):
    """The critic's V-target sampling is one-off: it runs with the prefix cache paused, and after it the trainer
    drops every kept cache (``retain_prefixes([])``) before the critic worker trains."""
    import contextlib

    class Retaining(fake_engine):
        def __init__(self, script):
            super().__init__(script)
            self.retained, self.paused, self.paused_calls = [], False, 0

        def retain_prefixes(self, sequences):
            self.retained.append(sequences)

        @contextlib.contextmanager
        def prefix_cache_paused(self):
            self.paused = True
            yield
            self.paused = False

        def generate(self, prompts, sampling):
            self.paused_calls += self.paused
            return super().generate(prompts, sampling)

    engine = Retaining(lambda call, i, prompt: [100 + i % K])
    critic = RecordingGroup(target_min_q=prefer_candidate(2, K), update={"critic/loss": 0.0})
    trainer = trainer_with_fakes("chai_twenty_questions", engine, [f"archer.chai_candidates={K}",
                                                                   "archer.critic_epochs=1", "archer.batch_size=2",
                                                                   "actor.mini_batch_size=2"], critic=critic)
    trainer.buffer.add([record(0, 0, -1.0, [1, 2], [3]), record(1, 0, -1.0, [4, 5], [6])])
    trainer._critic_update()
    played, dropped = engine.retained
    assert sorted(played) == [[1, 2, 102], [4, 5, 102]] and dropped == []
    assert engine.paused_calls == len(engine.calls) == 1 and not engine.paused
