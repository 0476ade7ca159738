"""Recorded dialogues in the ArCHer reference code's JSON formats as warm-start data (``ragen.archer.dialogues``):
the loader, the replay env speaking the live envs' texts, the agent proxy imitating them, and an ArCHer warm start
on the shipped samples."""

from pathlib import Path

import pytest
from test_archer_runs import _overrides
from trainer_helpers import assert_all_finite, read_metrics

from ragen.agent import AgentProxy, EnvGroupSpec
from ragen.agent.expert import ExpertResponder
from ragen.archer.dialogues import DialogueReplayEnv, load_dialogues, split_line
from ragen.archer.main import run, validate_archer
from ragen.env.guess_my_city import GuessMyCityEnv
from ragen.env.twenty_questions import TwentyQuestionsEnv
from ragen.trainer.config.compose import load_train_config
from ragen.trainer.config.schema import ConfigError

DATA = Path(__file__).resolve().parents[2] / "ragen" / "data" / "dialogues"
TQ, CITY = str(DATA / "twenty_questions_sample.json"), str(DATA / "guess_my_city_sample.json")


def _play(env, seed: int) -> tuple[list[str], list[str], list[float], bool]:
    """(questions asked = the expert's, observations, rewards, success) of one episode."""
    env.reset(seed)
    questions, observations, rewards, done, res = [], [], [], False, None
    while not done:
        questions.append(env.expert_action())
        res = env.step(questions[-1])
        observations.append(res.observation)
        rewards.append(res.reward)
        done = res.done
    return questions, observations, rewards, bool(res.info["success"])


def test_loader_reads_both_reference_formats():
    assert split_line("Is it red? No.") == ("Is it red?", "No.") and split_line("hello") == ("hello", "")
    dog, apple, spoon = load_dialogues(TQ)
    assert dog.questions == ("Is it an animal?", "Is it a mammal?", "Is it bigger than a breadbox?", "Is it a pet?",
                             "Is it a dog?")
    assert dog.answers == ("Yes.",) * 5 and (dog.word, dog.success) == ("dog", True)
    assert (apple.word, apple.success, len(apple.questions)) == ("apple", True, 4)
    assert (spoon.word, spoon.success, spoon.questions[-1]) == ("spoon", False, "Is it a car?")
    paris, sydney = load_dialogues(CITY)
    assert paris.questions[2] == ("Based on the information provided, my next question would be:\n\n"
                                  "Is your city in France?")
    assert paris.answers[2] == "Yes, it is in France." and (paris.word, paris.success) == ("Paris", True)
    assert (sydney.word, sydney.success) == ("Sydney", False)  # the last question names Lima


def test_replay_speaks_the_live_envs_texts():
    """Twenty Questions: replaying the "dog" dialogue gives exactly the observations and rewards of the live env
    (small table) whose secret is dog, asked the same questions. Guess My City: the live env's instructions,
    opening and win text; an answer naming the city before the guess is censored; a lost dialogue ends after its
    last recorded question."""
    live = TwentyQuestionsEnv(max_turns=5, objects_path="small")
    seed = next(s for s in range(100) if live.reset(s) and live.secret.name == "dog")
    replay = DialogueReplayEnv(path=TQ, game="twenty_questions", max_turns=5)
    assert replay.instructions == live.instructions and replay.reset(0) == live.reset(seed)
    assert replay.legal_actions() == live.legal_actions()
    questions, obs, rewards, won = _play(replay, 0)
    live_obs = [live.step(q).observation for q in questions]
    assert obs == live_obs and rewards == [-1.0, -1.0, -1.0, -1.0, 0.0] and won
    assert obs[-1] == "Answer: Yes. You guessed it: the object is dog."
    _, obs, rewards, won = _play(replay, 2)  # spoon: 4 questions, the guess was wrong
    assert obs[-1] == "Answer: No. No questions left; the object was spoon." and rewards == [-1.0] * 4 and not won

    city_live, city = GuessMyCityEnv(max_turns=20), DialogueReplayEnv(path=CITY, game="guess_my_city", max_turns=20)
    assert city.instructions == city_live.instructions and city.reset(0) == city_live.reset(0)
    _, obs, rewards, won = _play(city, 0)
    assert obs[0] == "Answer: My city is in Europe. Questions left: 19."
    assert obs[-1] == "Answer: Yes, you guessed it: the city is Paris." and rewards[-1] == 0.0 and won
    _, obs, rewards, won = _play(city, 1)
    assert obs[0] == "Answer: I can't answer that question. Questions left: 19."
    assert obs[-1] == "Answer: No, the city I am from is not Lima. No questions left; the city was Sydney."
    assert len(obs) == 3 and not won
    short = DialogueReplayEnv(path=TQ, game="twenty_questions", max_turns=3)  # cut at max_turns
    assert len(_play(short, 0)[1]) == 3 and not _play(short, 0)[3]


def test_the_agent_proxy_imitates_the_recorded_questions(default_tokenizer, fake_engine):
    agent = load_train_config("archer_twenty_questions").agent_config()
    spec = EnvGroupSpec("offline_dialogues", {"path": TQ, "game": "twenty_questions", "max_turns": 5}, 3, 1, 5)
    proxy = AgentProxy(fake_engine(lambda *a: []), default_tokenizer, agent, [spec], [], seed=0)
    batch = proxy.rollout("train", responder=ExpertResponder(default_tokenizer, agent, proxy.fmt.eot_id))
    recorded = load_dialogues(TQ)
    episodes = list({id(e): e for e in batch.episodes}.values())  # turn layout: the episode's record on every row
    for episode, dialogue in zip(episodes, recorded, strict=True):
        assert [t.actions for t in episode.turns] == [[q] for q in dialogue.questions]
        assert all(t.format_ok for t in episode.turns) and episode.success == dialogue.success
    assert batch.metrics["env/offline_dialogues/success"] == pytest.approx(2 / 3)
    assert int(batch.response_mask.sum()) > 0


def test_archer_warm_start_on_recorded_dialogues(tmp_path):
    overrides = [*_overrides(tmp_path, steps=0), "trainer.sft_warmup_steps=1", "sft.noise=0.0", "sft.lr=1e-2",
                 f"archer.offline_dialogues={TQ}", "trainer.val_freq=0", "env.max_turn=5", "env.config.max_turns=5"]
    run(load_train_config("archer_twenty_questions", overrides))
    records = read_metrics(tmp_path)
    assert_all_finite(records)
    (sft,) = [r for r in records if "sft/nll" in r]
    assert sft["sft/env/offline_dialogues/success"] == 1.0  # seeds 0, 1 (trainer.seed 0): the dog and apple games
    assert sft["sft/env/offline_dialogues/turns"] == pytest.approx(4.5)
    assert any(r.get("val/after_warm_start") == 1.0 for r in records)


def test_offline_dialogue_config_errors_name_the_key(tmp_path):
    def problems(*extra):
        with pytest.raises(ConfigError) as err:
            validate_archer(load_train_config("archer_twenty_questions", list(extra)))
        return str(err.value)

    assert "trainer.sft_warmup_steps=0" in problems(f"archer.offline_dialogues={TQ}", "trainer.sft_warmup_steps=0")
    assert "set sft.noise=0" in problems(f"archer.offline_dialogues={TQ}", "sft.noise=0.5")
    assert "does not exist" in problems(f"archer.offline_dialogues={tmp_path / 'none.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"text": "hi"}]')
    assert "record 0: expected an object with 'lines'" in problems(f"archer.offline_dialogues={bad}")
    with pytest.raises(ConfigError, match="env.name='bandit': recorded dialogues replay twenty_questions or guess"):
        validate_archer(load_train_config("archer_common", [f"archer.offline_dialogues={TQ}",
                                                             "trainer.sft_warmup_steps=1"]))
    validate_archer(load_train_config("archer_twenty_questions", [f"archer.offline_dialogues={TQ}"]))
