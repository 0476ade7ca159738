"""Env experts (``expert_action``): they solve their env with its default config, only read the state, recover from
a random legal action, and ``has_expert`` names exactly the envs that have one.

Measured with the default configs (``config/env/<name>.yaml``) when this file was written:
success 1.0 on every seed for the exact experts (bandit, delayed_choice, frozen_lake, sokoban, countdown,
search_qa, static_qa, webshop on the shipped catalog); the heuristic ones also won every game with the scripted
oracle: twenty_questions 135/135 objects (8.1 questions on average, at most 15 of 20), guess_my_city 153/153
cities (2.6 questions on average, at most 3). Slippery frozen_lake (not a default): 0.93 over seeds 0-99.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import yaml

import ragen.env as E
import ragen.env.text_adventure as text_adventure
from ragen.env.frozen_lake import shortest_path
from ragen.env.guess_my_city import expert_planner as city_planner
from ragen.env.oracle import INVALID
from ragen.env.search_qa import contains_alias
from ragen.env.sokoban import parse_room, solve
from ragen.env.twenty_questions import EXPERT_QUESTIONS
from ragen.env.twenty_questions import expert_planner as object_planner
from ragen.env.webshop.scoring import purchase_score

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config" / "env"
WITH_EXPERT = ["bandit", "countdown", "delayed_choice", "frozen_lake", "guess_my_city", "search_qa", "sokoban",
               "static_qa", "twenty_questions", "webshop"]
EXACT = ["bandit", "countdown", "delayed_choice", "frozen_lake", "search_qa", "sokoban", "static_qa", "webshop"]
HEURISTIC = {"twenty_questions": 1.0, "guess_my_city": 1.0}  # measured success rate over SEEDS (module docstring)
MARGIN = 0.1
SEEDS = range(20)
MAX_ACTIONS = 200  # a safety net: no expert episode comes close


def default_config(name: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())["config"] or {}


def make(name: str):
    """A fresh env built from the default config (heavy data is cached by the env modules themselves)."""
    return E.make(name, **default_config(name))


def play(env, seed: int, noise_at: int | None = None, rng: random.Random | None = None):
    """Play one episode with the expert (on step ``noise_at`` a random comma-separated piece of ``legal_actions()``:
    a listed action where the env has ``action_list``, else an off-path piece of its description); returns
    (observations, actions, results)."""
    observations, actions, results = [env.reset(seed)], [], []
    done = False
    while not done:
        assert len(actions) < MAX_ACTIONS, f"expert episode of {type(env).__name__} does not end"
        if noise_at is not None and len(actions) == noise_at:
            legal = [a.strip() for a in env.legal_actions().split(",") if a.strip()]
            action = rng.choice(legal)
        else:
            action = env.expert_action()
            assert env.expert_action() == action  # asking again gives the same answer
        result = env.step(action)
        actions.append(action)
        results.append(result)
        observations.append(result.observation)
        done = result.done
    return observations, actions, results


WITH_ACTION_LIST = ["bandit", "delayed_choice", "frozen_lake", "sokoban", "text_adventure"]


def test_action_list_exactly_for_envs_with_a_listed_action_set():
    """The warm start's random actions (``sft.noise``) come from ``action_list``: the envs with a fixed small action
    set have it; free-text envs (questions, expressions, answers, searches) do not."""
    from ragen.env.base import _BUILTIN_MODULES

    builtin = [n for n in E.names() if n in _BUILTIN_MODULES]
    assert [n for n in builtin if E.has_action_list(n)] == WITH_ACTION_LIST


@pytest.mark.parametrize("name", [n for n in WITH_ACTION_LIST if n != "text_adventure"])
def test_every_listed_action_is_legal_and_is_what_the_prompt_shows(name):
    env = make(name)
    for seed in range(6):
        env.reset(seed)
        listed = env.action_list()
        assert listed and env.legal_actions() == ", ".join(listed)
        for action in listed:
            env.reset(seed)
            assert env.step(action).info["action_is_valid"], (name, seed, action)


def test_has_expert_exactly_for_envs_with_one():
    from ragen.env.base import _BUILTIN_MODULES

    builtin = [n for n in E.names() if n in _BUILTIN_MODULES]  # test suites register envs of their own
    assert [n for n in builtin if E.has_expert(n)] == WITH_EXPERT
    assert not E.has_expert("text_adventure")
    assert "No expert" in text_adventure.__doc__
    with pytest.raises(ValueError, match="unknown env"):
        E.has_expert("no_such_env")


@pytest.mark.parametrize("name", EXACT)
def test_exact_expert_solves_every_seed(name):
    env = make(name)
    for seed in SEEDS:
        _, actions, results = play(env, seed)
        assert results[-1].info["success"] is True, f"{name} seed {seed}: {actions}"
        assert all(r.info["action_is_valid"] for r in results), f"{name} seed {seed}: {actions}"


@pytest.mark.parametrize("name", sorted(HEURISTIC))
def test_heuristic_expert_success_rate(name):
    env = make(name)
    wins, turns = 0, []
    for seed in SEEDS:
        _, actions, results = play(env, seed)
        wins += results[-1].info["success"]
        turns.append(len(actions))
        assert len(actions) <= env.max_turns
    rate = wins / len(SEEDS)
    print(f"{name}: expert success {rate:.2f} over {len(SEEDS)} seeds, {sum(turns) / len(turns):.1f} questions")
    assert rate >= HEURISTIC[name] - MARGIN


@pytest.mark.parametrize("name", WITH_EXPERT)
def test_expert_only_reads_the_state(name):
    """Same observations, rewards and infos when the recorded expert actions are typed into a second env."""
    played, replayed = make(name), make(name)
    for seed in range(3):
        observations, actions, results = play(played, seed)
        assert replayed.reset(seed) == observations[0]
        for action, obs, result in zip(actions, observations[1:], results, strict=True):
            again = replayed.step(action)
            assert (again.observation, again.reward, again.done) == (obs, result.reward, result.done)
            assert again.info == result.info


@pytest.mark.parametrize("name", WITH_EXPERT)
def test_expert_is_a_clear_error_outside_an_episode(name):
    env = make(name)
    with pytest.raises(RuntimeError, match="reset"):
        env.expert_action()
    play(env, 0)
    with pytest.raises(RuntimeError, match="over"):
        env.expert_action()


@pytest.mark.parametrize("name", ["frozen_lake", "sokoban"])
def test_grid_expert_recovers_after_a_random_move(name):
    env, rng, checked = make(name), random.Random(0), 0
    for seed in SEEDS:
        for noise_at in (0, 1, 2):
            env.reset(seed)
            for _ in range(noise_at):  # expert moves up to the noisy one
                env.step(env.expert_action())
            env.step(rng.choice(env.action_list()))
            if name == "frozen_lake":
                solvable = not env._done and shortest_path(env.desc, env.position) is not None
            else:
                solvable = not env._done and solve(env.room) is not None
            if not solvable:
                continue
            result = None
            while result is None or not result.done:
                result = env.step(env.expert_action())
            assert result.info["success"], f"{name} seed {seed}, noise at {noise_at}"
            checked += 1
    assert checked >= 40


@pytest.mark.parametrize("name", ["guess_my_city", "search_qa", "twenty_questions", "webshop"])
def test_expert_recovers_after_a_random_legal_action(name):
    """An off-path action (a piece of the free-text envs' ``legal_actions()`` description; their warm start draws
    no random actions) on step 0 or 1, then the expert: it wins whenever that action did not end the episode."""
    env, rng, checked = make(name), random.Random(1), 0
    for seed in range(12):
        noise_at = seed % 2
        _, actions, results = play(env, seed, noise_at=noise_at, rng=rng)
        if results[noise_at].done:
            continue
        assert all(r.info["action_is_valid"] for r in results[noise_at + 1:]), actions
        assert results[-1].info["success"], f"{name} seed {seed}: {actions}"
        checked += 1
    assert checked >= 4


def test_delayed_choice_expert_plays_on_after_a_wrong_door():
    env = make("delayed_choice")
    env.reset(0)
    env.step(next(d for d in env.doors if d != env.good_door))
    result = env.step(env.expert_action())
    assert result.info["action_is_valid"] and result.done and not result.info["success"]


def test_sokoban_deadlock_gives_a_walking_move():
    env = make("sokoban")
    env.reset(0)
    env.room = parse_room("######\n#X__O#\n#_P__#\n######")
    assert solve(env.room) is None  # the box is stuck in a corner
    result = env.step(env.expert_action())
    assert result.info["action_is_valid"] and result.info["action_is_effective"]
    assert env.room.boxes == frozenset({(1, 1)})  # the fallback walks, it does not push


def test_frozen_lake_unreachable_goal_gives_a_safe_move():
    env = make("frozen_lake")
    env.reset(0)
    env._desc = ["SHFF", "HFFF", "FFFF", "FFFG"]  # the expert reads this map: the start is walled in by holes
    assert shortest_path(env.desc, (0, 0)) is None
    assert env.expert_action() == "Left"  # bump into the edge rather than walk into a hole


def test_slippery_frozen_lake_expert_beats_the_shortest_path():
    env, wins = E.make("frozen_lake", is_slippery=True), 0
    for seed in range(30):
        _, _, results = play(env, seed)
        wins += results[-1].info["success"]
    assert wins / 30 >= 0.8  # measured 0.93 over seeds 0-99; following BFS blindly wins 0.2


def test_countdown_expert_is_the_generators_solution():
    env = make("countdown")
    for seed in SEEDS:
        env.reset(seed)
        assert env.expert_action() == env.puzzle.solution
        assert env.step(env.puzzle.solution).info["outcome"] == "correct"


def test_search_qa_expert_query_puts_a_gold_passage_first():
    env = make("search_qa")
    for seed in range(len(env.items)):
        env.reset(seed)
        hits = env.index.search(env.expert_query(), env.top_k)
        top = env.passages[hits[0].index]
        assert contains_alias(f"{top.title} {top.text}", env.item.answers)
        search = env.step(env.expert_action())
        assert search.info["answer_in_first_result"] and search.info["tool_successes"] == 1
        answer = env.step(env.expert_action())
        assert answer.info["exact_match"] and answer.info["format_ok"] and answer.done
        # the best return: tool 0.2 + retrieval 0.5, then exact 1 + format 0.2 + xml 0.2
        assert (search.reward, answer.reward) == (pytest.approx(0.7), pytest.approx(1.4))


def test_search_qa_expert_answers_when_no_search_would_leave_room_for_it():
    env = E.make("search_qa", max_tool_calls=1)
    env.reset(0)
    assert env.expert_action() == env.item.answers[0]
    strict = E.make("search_qa", bare_text_is_answer=False, max_tool_calls=0)
    strict.reset(0)
    assert strict.step(strict.expert_action()).info["success"]


def test_question_banks_are_answered_for_every_secret():
    env = make("twenty_questions")
    planner = object_planner(env.objects_path)
    for question in EXPERT_QUESTIONS:
        answers = set(planner.answers(question))
        assert INVALID not in answers and len(answers) == 2, question
    cities = city_planner(0)
    for question in cities.questions:
        assert not any(a.startswith("I don't know") for a in cities.answers(question)), question


def test_webshop_expert_gets_the_best_score_of_the_goal_product():
    env = make("webshop")
    for seed in range(len(env.goals)):
        _, actions, results = play(env, seed)
        product = env.catalog.products[env.goal.asin]
        best = max(purchase_score(product, env.goal, product.price, combo, env.nouns).total
                   for combo in itertools.product(*product.options.values()))
        assert results[-1].reward == pytest.approx(best), actions
        assert results[-1].info["purchased_asin"] == env.goal.asin
